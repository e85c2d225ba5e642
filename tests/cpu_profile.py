"""Where a command's CPU goes, by kind of process: the measure behind the suite's time budget
(docs/development/testing.md). Runs the command, reads every process's CPU seconds from /proc twice a
second until it ends (a process that lives under half a second may be missed; what such processes
cost is small), and prints the seconds and the count of processes per kind, largest first:

    .venv/bin/python tests/cpu_profile.py -- env CI=true .venv/bin/python -m pytest -n auto tests

Only processes started after the command count (a server or kernel thread already running does not).
Linux only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
KINDS = (  # (kind, pattern in the command line), the first that matches
    ("shard jobs (infer)", r"\.infer\.py"),
    ("plan, gather, tokenize, report jobs", r"\.(plan|gather|tokenize_shard|report)\.py"),
    ("job wrappers (snakemake --mode remote)", r"-m snakemake .*--target-jobs"),
    ("snakemake starts", r"-m snakemake|bin/snakemake"),
    ("vLLM processes (servers, engine cores, workers, node ranks)",
     r"spawn_main|vllm\.entrypoints|shardinfer\.nodes\.vllm_worker"),
    ("engine probes", r"tests/\w+_probe\.py"),
    ("pytest and its workers", r"pytest|exec\(eval\(sys\.stdin"),
)


def kind_of(command: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, command)), "other")


def sample(seen: dict, since: float) -> None:
    """Each process's CPU seconds so far, by (pid, start tick); its command line on first sight."""
    boot = time.time() - float(open("/proc/uptime").read().split()[0])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            started = boot + int(fields[19]) / TICK
            if started < since:
                continue
            key = (pid, fields[19])
            if key not in seen:
                seen[key] = [open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace"), 0]
            seen[key][1] = (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, ValueError, IndexError):
            continue


def profile(command: list[str]) -> tuple[int, dict]:
    seen: dict = {}
    since = time.time() - 1
    running = subprocess.Popen(command)
    while running.poll() is None:
        sample(seen, since)
        time.sleep(0.5)
    return running.returncode, seen


def report(seen: dict, wall: float) -> None:
    seconds, count = Counter(), Counter()
    for command, cpu in seen.values():
        seconds[kind_of(command)] += cpu
        count[kind_of(command)] += 1
    total = sum(seconds.values())
    print(f"\n{total:.0f} CPU s over {len(seen)} processes in {wall:.0f} s wall "
          f"({total / wall:.2f} cores busy on average)")
    for kind, value in seconds.most_common():
        print(f"{value:8.0f} CPU s {count[kind]:6d} processes  {kind}")


def main() -> int:
    if "--" not in sys.argv:
        sys.exit("usage: cpu_profile.py -- COMMAND [ARG ...]")
    command = sys.argv[sys.argv.index("--") + 1:]
    started = time.time()
    status, seen = profile(command)
    report(seen, time.time() - started)
    return status


if __name__ == "__main__":
    sys.exit(main())
