"""A variant of a benchmark in a process of its own, end to end as a Snakemake job runs (imports,
model load or engine start, generation, writing): the shard job (`run_shard`), or vLLM's bare
`LLM.generate` (`benchmarks.bare`). `child` starts `scripts/benchmark.py --child ...`, whose
`run_child` does the work and writes what it reports beside its output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from benchmarks import REPO, engine_counts
from benchmarks.bare import bare_vllm
from shardinfer.engines.vllm.engine import engine_environment
from shardinfer.settings.config import Settings
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob

ENTRY = REPO / "scripts" / "benchmark.py"  # its hidden --child flags run `run_child`


def child(mode: str, settings: Settings, work: Path, device: str, label: str = "") -> dict:
    """`mode` (shard: the shard job; bare: vLLM's LLM.generate) in a process of its own, as a
    Snakemake job runs; its wall-clock seconds and what it reports. `label` ends its files' names
    (a variant's: `-n4`)."""
    name = f"{mode}-{settings.task_settings.get('engine', 'transformers')}{label}"
    out = work / f"{name}.{'parquet' if mode == 'shard' else 'json'}"
    (work / f"{name}-settings.json").write_text(json.dumps(settings.to_dict()))
    command = [sys.executable, str(ENTRY), "--child", mode, "--child-settings", str(work / f"{name}-settings.json"),
               "--child-out", str(out), "--device", device]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-4000:]}")
    if mode == "shard":
        import pyarrow.parquet as pq

        from shardinfer.contract.shard_file import STATS_KEY

        stats = json.loads(pq.ParquetFile(out).metadata.metadata[STATS_KEY])
        engine = json.loads(Path(f"{out}.engine.json").read_text())  # vLLM's scheduler counts (none: transformers)
        return {"wall": wall, "stats": stats, "frame": pd.read_parquet(out),
                "engine": engine if engine["steps"] else None}
    return {"wall": wall, **json.loads(out.read_text())}


def run_child(args: argparse.Namespace) -> None:
    """The child process of `child`: a shard job (`run_shard`) or the bare engine on the same token ids."""
    settings = Settings.from_dict(json.loads(Path(args.child_settings).read_text()))
    work = Path(args.child_settings).parent
    if args.child == "shard":
        job = ShardJob(settings, str(work / "plan.json"), 0, args.child_out, "bench", threads=torch.get_num_threads())
        if settings.task_settings.get("engine") == "vllm":
            engine_environment()
            engine_counts.count_schedules()
        run_shard(job)
        Path(args.child_out + ".engine.json").write_text(json.dumps(engine_counts.taken()))
        return
    Path(args.child_out).write_text(json.dumps(bare_vllm(settings, args.device)))


def generating(run: dict) -> float:
    """A `child` run's generating seconds: a shard job's device stage, bare vLLM's `generate`."""
    return run["stats"]["stages"]["device"] if "stats" in run else run["generate_s"]
