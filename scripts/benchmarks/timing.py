"""The timers the workflow-level benchmarks share: a step's seconds, printed under its label; a
command's wall and CPU seconds (the process and its children); a Snakemake benchmark file's row
(each rule's `benchmark:`: its job's seconds, peak memory, CPU time).
"""

from __future__ import annotations

import csv
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(label: str, function: Callable, *args) -> Any:
    """`function(*args)`, its seconds printed after `label` (a finished process keeps them as `wall_s`)."""
    started = time.perf_counter()
    result = function(*args)
    seconds = time.perf_counter() - started
    print(f"{label}: {seconds:.1f} s", flush=True)
    if hasattr(result, "returncode"):
        result.wall_s = seconds
    return result


def process_seconds(command: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + sys of the process and its children) of one command, which must
    succeed: a failure ends the benchmark with the command and the end of its output."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def benchmark_row(path: Path) -> dict[str, str]:
    """A rule's benchmark file (tab-separated, one row per run of its job): the first row, as text."""
    with open(path) as handle:
        return next(csv.DictReader(handle, delimiter="\t"))
