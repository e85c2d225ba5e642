"""`scripts/benchmark.py --task generate`: the shard job on a causal LM (greedy) against one
`model.generate` call per row (on the first `--naive-rows` rows) and against unsorted fixed batches
of 8 (left padding), same prompts, same max_new_tokens, same dtype; with vLLM installed, the shard
job with each engine and vLLM's bare `LLM.generate` on the same token ids (`benchmarks.runs` prints
them). `--variants`: the generation features' cost instead (`benchmarks.variants`).
"""

from __future__ import annotations

import argparse
import dataclasses
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.child import child
from benchmarks.common import bench_settings, build_generator, interleaved, kept, prompt_texts
from benchmarks.runs import Run, baseline_run, length_summary, print_engines, print_generate
from benchmarks.variants import bench_variants
from shardinfer.hf.batching import length_sorted_batches
from shardinfer.plan.plan_file import run_plan
from shardinfer.settings.config import BatchSettings
from shardinfer.shard.job import first_window


def bench_generate(args: argparse.Namespace, work: Path) -> None:
    """Same prompts, same max_new_tokens, greedy, same dtype: naive loop, fixed batches of 8, the
    shard job with each engine and, with vLLM, its bare LLM.generate."""
    shape = args.shape or ("qwen-cpu-gen" if args.device == "cpu" else "qwen-0.5b")
    if not shape.startswith("qwen"):
        raise SystemExit(f"--task generate needs a decoder shape (qwen-cpu-gen, qwen-cpu-small or qwen-0.5b); "
                         f"got {shape}")
    rows = args.rows or (300 if args.device == "cpu" else 600)
    penalty = 1.0 if args.variants else args.repetition_penalty  # sampled variants; logprobs on transformers need none
    model_dir = build_generator(shape, work / "model", args.eos_rate, penalty)
    texts = prompt_texts(rows)
    pd.DataFrame({"id": np.arange(rows), "text": texts}).to_parquet(work / "input.parquet")
    settings = bench_settings(model_dir, work / "input.parquet", args.max_length, args.max_tokens, "generate",
                              args.max_new_tokens, max_rows=args.max_rows)
    run_plan(settings.input, 1, args.max_length, str(work / "plan.json"))
    torch.ones(1, device=args.device)  # start CUDA (or not) outside the timings
    if args.variants:
        print(f"\n{shape}, {rows} prompts, max_new_tokens {args.max_new_tokens}, sampled; generation variants")
        return bench_variants(settings, work, args.device, args.engines, args.vllm_args, args.repeats,
                              args.only and args.only.split(","))
    vllm = dataclasses.replace(settings, task_settings={"engine": "vllm", "vllm": args.vllm_args})
    variants = {} if args.engines_only else {
        "naive": partial(naive_generate, model_dir, texts[: args.naive_rows], args.device, args.max_new_tokens),
        "fixed": partial(fixed_batches, model_dir, texts, args.device, args.max_new_tokens)}
    variants["ours"] = partial(child, "shard", settings, work, args.device)
    if "vllm" in args.engines:
        variants.update(vllm=partial(child, "shard", vllm, work, args.device),
                        bare=partial(child, "bare", vllm, work, args.device))
    runs_of = {name: [] for name in variants}  # every repeat's result of the child variants, for their parts
    variants.update({name: partial(kept, runs_of[name], variants[name]) for name in ("ours", "vllm", "bare")
                     if name in variants})
    results, seconds = interleaved(args.repeats, variants)
    ours_run = results["ours"]
    stats, frame = ours_run["stats"], ours_run["frame"]

    from transformers import AutoTokenizer

    tokenizer, prompts = AutoTokenizer.from_pretrained(model_dir), frame["n_prompt_tokens"].to_numpy(np.int64)
    generated = frame["n_generated_tokens"].to_numpy(np.int64)
    costs = prompts + args.max_new_tokens
    ours = Run(f"shard job, transformers (budget {args.max_tokens} tok)", seconds["ours"], frame["generated"].tolist(),
               generated, prompts, our_batches(costs, settings.batch))
    print(f"\n{shape} on {stats['device']} in {stats['dtype']}, {rows} rows, prompts {prompts.min()}..{prompts.max()} "
          f"tokens (median {int(np.median(prompts))}), max_new_tokens {args.max_new_tokens}, greedy")
    print(length_summary(generated, frame["finish_reason"], args.max_new_tokens))
    sizes = [len(b) for b in ours.batches]
    print(f"shard job: {len(sizes)} batches of {min(sizes)}..{max(sizes)} rows (max_rows {args.max_rows})")
    if not args.engines_only:
        naive, fixed = results["naive"], results["fixed"]
        print_generate([baseline_run(f"naive (one generate per row, first {len(naive)})", naive, seconds["naive"],
                                     tokenizer, prompts, 1),
                        baseline_run("fixed batches of 8 (input order)", fixed, seconds["fixed"], tokenizer,
                                     prompts, 8),
                        ours])
    if "vllm" in args.engines:
        print_engines(runs_of["ours"], runs_of["vllm"], runs_of["bare"], seconds, tokenizer, ours)


def load_causal_lm(model_dir: Path, device: str):
    """Tokenizer and model in the shard job's dtype (float32 on CPU, bfloat16 on a GPU), so the
    variants differ only in how rows are batched."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    return AutoTokenizer.from_pretrained(model_dir), model


def until_eos(ids: list[int], eos: int) -> list[int]:
    """A row's generated ids up to and including its first eos (what `n_generated_tokens` counts);
    generate pads a finished row with the pad id after it."""
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@torch.inference_mode()
def naive_generate(model_dir: Path, texts: list[str], device: str, max_new: int) -> list[list[int]]:
    """The naive loop: one `generate` call per row, no padding, each row stops at its own eos."""
    tokenizer, model = load_causal_lm(model_dir, device)
    eos, rows = tokenizer.eos_token_id, []
    for text in texts:
        inputs = tokenizer(text, return_tensors="pt").to(device)
        out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        rows.append(until_eos(out[0, inputs["input_ids"].shape[1] :].tolist(), eos))
    return rows


@torch.inference_mode()
def fixed_batches(model_dir: Path, texts: list[str], device: str, max_new: int, size: int = 8) -> list[list[int]]:
    """Unsorted fixed batches: `size` rows in input order, left-padded to their longest prompt;
    generate runs each batch until its last row is done."""
    tokenizer, model = load_causal_lm(model_dir, device)
    tokenizer.padding_side = "left"
    eos, rows = tokenizer.eos_token_id, []
    for start in range(0, len(texts), size):
        inputs = tokenizer(texts[start : start + size], padding=True, return_tensors="pt").to(device)
        out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        rows.extend(until_eos(row, eos) for row in out[:, inputs["input_ids"].shape[1] :].tolist())
    return rows


def our_batches(costs: np.ndarray, batch: BatchSettings) -> list[np.ndarray]:
    """The batches the shard job cuts, as row numbers: windows of rows (a short first one), each
    sorted by cost and cut under the budget (`shardinfer.shard.device_loop.prepare_batches`)."""
    batches, first, size = [], 0, first_window(batch.sort_window)
    while first < len(costs):
        window = costs[first : first + size]
        batches.extend(first + b for b in length_sorted_batches(window, batch.max_tokens, batch.max_rows))
        first, size = first + len(window), batch.sort_window
    return batches
