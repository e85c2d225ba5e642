"""`scripts/benchmark.py` (`--task classify`, the default): the shard runner against the naive loop
on a classifier, same data, same model, one run.

The naive loop is the common way: pad every text to max_length, float32, batches of 10, input
order. The shard runner is `shardinfer.shard.job.run_shard` itself, end to end: read the parquet
input, tokenize, length-sorted token-budget batches, run, write the shard file; then the same with
the token ids made ahead (the tokenize rule's job). Outputs are compared before any number is
printed; on a GPU, the share of its bf16 matmul peak the shard runner reached.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import bench_settings, build_model, long_tailed_texts, timed
from shardinfer.plan.plan_file import run_plan
from shardinfer.settings.config import Settings
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob
from shardinfer.shard.tokenize_job import TokenizeJob, run_tokenize


@torch.inference_mode()
def naive_loop(model_dir: Path, texts: list[str], device: str, max_length: int, batch: int) -> np.ndarray:
    """Pad to max_length, float32, fixed small batches, input order."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    probs = []
    for start in range(0, len(texts), batch):
        inputs = tokenizer(texts[start : start + batch], padding="max_length", truncation=True,
                           max_length=max_length, return_tensors="pt").to(device)
        probs.append(torch.softmax(model(**inputs).logits.float(), -1).cpu().numpy())
    return np.concatenate(probs)


def shard_runner(settings: Settings, work: Path, tokens: str | None = None) -> tuple[dict, pd.DataFrame]:
    """`run_shard` end to end: read, tokenize (or read token ids made ahead), batch, run, write;
    returns the job's stats and the shard file it wrote."""
    out = work / ("shard-ahead.parquet" if tokens else "shard.parquet")
    job = ShardJob(settings, str(work / "plan.json"), 0, str(out), "bench", threads=torch.get_num_threads(),
                   tokens=tokens, tokenizer_key="bench" if tokens else None)
    return run_shard(job), pd.read_parquet(out)


def tokenize_ahead(settings: Settings, work: Path) -> str:
    """The tokenize rule's work for the shard (a CPU job of its own in the workflow)."""
    run_tokenize(TokenizeJob(settings, str(work / "plan.json"), 0, str(work / "tokens.parquet"), "bench"))
    return str(work / "tokens.parquet")


def bench_classify(args: argparse.Namespace, work: Path) -> None:
    """The shard runner against the naive loop (pad to max_length, fp32, batches of 10) on a classifier."""
    shape = args.shape or ("cpu-small" if args.device == "cpu" else "bert-base")
    rows = args.rows or 2000
    model_dir = build_model(shape, work / "model")
    texts = long_tailed_texts(rows)
    pd.DataFrame({"id": np.arange(rows), "text": texts}).to_parquet(work / "input.parquet", row_group_size=8192)

    settings = bench_settings(model_dir, work / "input.parquet", args.max_length, args.max_tokens,
                              max_rows=args.max_rows)
    run_plan(settings.input, 1, args.max_length, str(work / "plan.json"))
    naive, naive_s = timed(naive_loop, model_dir, texts, args.device, args.max_length, args.naive_batch)
    (stats, ours), ours_s = timed(shard_runner, settings, work)
    tokens, tokenize_s = timed(tokenize_ahead, settings, work)
    (ahead_stats, ahead), ahead_s = timed(shard_runner, settings, work, tokens)
    ours, ahead = np.stack(ours["probs"]), np.stack(ahead["probs"])
    tolerance = 1e-4 if args.device == "cpu" else 3e-2  # bf16 on GPU
    assert (naive.argmax(1) == ours.argmax(1)).mean() > (0.999 if args.device == "cpu" else 0.98)
    assert np.abs(naive - ours).max() < tolerance, np.abs(naive - ours).max()
    assert np.array_equal(ours, ahead), "token ids made ahead must give the identical output"

    real = stats["real_tokens"]
    print(f"\n{shape} on {stats['device']}, {rows} rows, {real / rows:.0f} real tokens per row (mean)")
    print(f"{'':34}{'rows/s':>10}{'real tok/s':>12}{'padding':>9}")
    print(f"{'naive (pad 512, fp32, batch ' + str(args.naive_batch) + ')':34}{rows / naive_s:>10.0f}"
          f"{real / naive_s:>12.0f}{rows * args.max_length / real:>9.2f}")
    print(f"{'shard runner (' + stats['dtype'] + ', ' + str(args.max_tokens) + ' tok)':34}{rows / ours_s:>10.0f}"
          f"{real / ours_s:>12.0f}{stats['padding_ratio']:>9.3f}")
    print(f"{'  the same, tokens made ahead':34}{rows / ahead_s:>10.0f}{real / ahead_s:>12.0f}"
          f"{ahead_stats['padding_ratio']:>9.3f}   (+ tokenize job {tokenize_s:.2f} s, {real / tokenize_s:.0f} tok/s)")
    print(f"speed-up: {naive_s / ours_s:.1f}x; tokens made ahead: {naive_s / ahead_s:.1f}x  "
          f"(outputs agree: max |dp| {np.abs(naive - ours).max():.1e}; identical with tokens made ahead)")
    print(f"stages bounding the shard runner: {stats['bound_by']} (tokenizing in the job), "
          f"{ahead_stats['bound_by']} (tokens made ahead); per-stage seconds are in the log lines above")
    if args.device == "cuda":
        print_device_use(model_dir, texts, args.max_length, ours_s)


def print_device_use(model_dir: Path, texts: list[str], max_length: int, seconds: float) -> None:
    """The share of the GPU's bf16 matmul peak the shard runner reached (classify)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = np.asarray([len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]])
    peak, achieved = device_bf16_tflops(), model_flops(model_dir, lengths) / seconds / 1e12
    print(f"device bf16 matmul: {peak:.0f} TFLOP/s; shard runner achieved {achieved:.1f} TFLOP/s "
          f"({achieved / peak:.0%})")


def model_flops(model_dir: Path, lengths: np.ndarray) -> float:
    """Forward FLOPs on the real tokens: 2 x matmul weights per token plus attention's 4 x L^2 x d per layer."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    d, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    kv_width = d * kv // config.num_attention_heads
    gated = 3 if config.model_type == "qwen2" else 2
    per_token = 2 * layers * (2 * d * d + 2 * d * kv_width + gated * d * ffn)
    return float(per_token * lengths.sum() + 4 * layers * d * (lengths.astype(np.float64) ** 2).sum())


def device_bf16_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    started, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ a
    torch.cuda.synchronize()
    return 2 * 8192**3 * reps / (time.perf_counter() - started) / 1e12
