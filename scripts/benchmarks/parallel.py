"""`scripts/benchmark.py --task parallel`: the vLLM shard job with tensor_parallel_size 1 and 2 (on
CPU: vLLM's CPU build, one worker per core; on GPUs: one per leased GPU) on the same prompts,
greedy: each one's engine start-up, rows/s while generating and end to end, and whether their rows
agree. On a 2-core machine it checks that parallel 2 runs and gives the same rows, not that it is
faster.
"""

from __future__ import annotations

import argparse
import dataclasses
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.child import child, generating
from benchmarks.common import bench_settings, build_generator, interleaved, kept, prompt_texts
from shardinfer.plan.plan_file import run_plan


def bench_parallel(args: argparse.Namespace, work: Path) -> None:
    """The vLLM shard job with tensor_parallel_size 1 and 2, same prompts, greedy: start-up, rows/s
    and whether the rows agree (each variant in a process of its own, as a Snakemake job)."""
    rows = args.rows or 300
    model_dir = build_generator(args.shape or "qwen-cpu-gen", work / "model", args.eos_rate, args.repetition_penalty)
    pd.DataFrame({"id": np.arange(rows), "text": prompt_texts(rows)}).to_parquet(work / "input.parquet")
    settings = bench_settings(model_dir, work / "input.parquet", args.max_length, args.max_tokens, "generate",
                              args.max_new_tokens, max_rows=args.max_rows)
    run_plan(settings.input, 1, args.max_length, str(work / "plan.json"))
    variants, runs_of = {}, {}
    for size in (1, 2):
        parallel = {"engine": "vllm", "vllm": {**args.vllm_args, "tensor_parallel_size": size}}
        runs_of[size] = []
        variants[size] = partial(kept, runs_of[size], partial(child, "shard", dataclasses.replace(
            settings, task_settings=parallel), work, args.device, f"-tp{size}"))
    _, seconds = interleaved(args.repeats, variants)
    frames = {size: runs[-1]["frame"] for size, runs in runs_of.items()}
    print(f"\nvLLM shard job on {runs_of[1][-1]['stats']['device']}, {rows} prompts, max_new_tokens "
          f"{args.max_new_tokens}, greedy; fastest of {args.repeats} interleaved runs")
    print(f"{'tensor_parallel_size':>22}{'engine start s':>16}{'generating s':>14}{'rows/s generating':>19}"
          f"{'end to end s':>14}{'rows/s':>9}")
    for size, runs in runs_of.items():
        start = min(run["stats"]["engine_start_s"] for run in runs)
        fastest = min(generating(run) for run in runs)
        print(f"{size:>22}{start:>16.1f}{fastest:>14.1f}{rows / fastest:>19.1f}{min(seconds[size]):>14.1f}"
              f"{rows / min(seconds[size]):>9.1f}")
    same = sum(a == b for a, b in zip(frames[1]["generated"], frames[2]["generated"]))
    print(f"tensor parallel 2: {same} of {rows} rows identical to parallel size 1 "
          f"({'identical tables' if frames[1].equals(frames[2]) else 'tables differ'})")
