"""`scripts/benchmark.py --task vllm-feed`: the vLLM shard job, its engine fed across windows,
against one bare `LLM.generate` over all of the shard's prompts, and the price of bad prompts.

    PYTHONPATH=workflow .venv/bin/python scripts/benchmark.py --task vllm-feed --rows 1000 --max-new-tokens 256

Same prompts (long-tailed, as `--task generate`), same token ids, same engine arguments, greedy;
output lengths vary up to max_new_tokens (most rows end early on eos: `build_generator`). Each
variant runs in a process of its own, end to end as a Snakemake job runs, `--repeats` times in
turn; the generating time (the shard job's device stage; the bare call's `generate`) of the
fastest repeat counts, and beside it each round's ratio to bare, the median of the rounds
(`paired`: robust to a machine whose speed drifts between runs). Variants:

- the shard job at `batch.sort_window` 256 (many windows: where draining at each window's end
  cost the most) and at the default (16384: a short first window, then the rest);
- bare `LLM.generate` over every prompt at once: the peer, which never drains;
- the same shard job (default window, row_errors: record) on the same prompts of which 10 hold a
  token the model cannot embed (a tokenizer with an added token, the model not resized), against
  the same job on the good prompts: its time, and which rows failed.

Beside each its engine work (`engine_counts`: vLLM's scheduler's steps, tokens and request-steps):
a fed job's counts equal to bare vLLM's show the engine ran the same steps, never drained.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import engine_counts
from benchmarks.child import child, generating
from benchmarks.common import bench_settings, build_generator, prompt_texts
from benchmarks.paired import median_ratio
from shardinfer.plan.plan_file import run_plan
from shardinfer.settings.config import RowErrorSettings

BAD_WORD = "unembeddable"  # added to the tokenizer, not to the model's embedding


def bad_copy(model_dir: Path, out: Path) -> Path:
    """The model with a tokenizer that knows one more token than the model embeds."""
    from transformers import AutoTokenizer

    shutil.copytree(model_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_tokens([BAD_WORD])
    tokenizer.save_pretrained(out)
    return out


def bench_feed(args, work: Path) -> None:
    shape = args.shape or ("qwen-cpu-gen" if args.device == "cpu" else "qwen-0.5b")
    rows = args.rows or 1000
    model_dir = bad_copy(build_generator(shape, work / "model", args.eos_rate, args.repetition_penalty),
                         work / "model-bad")
    texts = prompt_texts(rows)
    bad_rows = sorted(np.random.default_rng(3).choice(rows, args.bad_rows, replace=False).tolist())
    spoiled = [f"{text} {BAD_WORD}" if row in bad_rows else text for row, text in enumerate(texts)]
    inputs = {}
    for name, values in (("good", texts), ("bad", spoiled)):
        (work / name).mkdir()
        pd.DataFrame({"id": np.arange(rows), "text": values}).to_parquet(work / name / "input.parquet")
        settings = bench_settings(model_dir, work / name / "input.parquet", args.max_length, args.max_tokens,
                                        "generate", args.max_new_tokens, max_rows=args.max_rows)
        settings = dataclasses.replace(settings, task_settings={"engine": "vllm", "vllm": args.vllm_args})
        run_plan(settings.input, 1, args.max_length, str(work / name / "plan.json"))
        inputs[name] = settings
    good, bad = inputs["good"], inputs["bad"]
    windowed = dataclasses.replace(good, batch=dataclasses.replace(good.batch, sort_window=256))
    recording = dataclasses.replace(bad, row_errors=RowErrorSettings("record", args.bad_rows))
    variants = {"window 256": (windowed, "shard"), "default window": (good, "shard"), "bare": (good, "bare"),
                "bad prompts": (recording, "shard")}
    runs = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (settings, mode) in variants.items():
            folder = work / ("bad" if settings is recording else "good")
            runs[name].append(child(mode, settings, folder, args.device, label="-" + name.replace(" ", "-")))
    report(runs, good, bad_rows, rows)
    in_process(good, 2 * args.repeats + 1)  # short runs: more rounds for the paired median


def in_process(settings, repeats: int) -> None:
    """The engine loop alone, in this process, one engine, interleaved (what the shard job adds
    around it and a busy machine's swings between processes left out): the shard's windows fed
    (sort_window 256, and one window) against one LLM.generate over the same token ids."""
    import time

    import pyarrow as pa
    import torch

    from shardinfer.engines.vllm.generate import VllmGenerate
    from shardinfer.hf.models import choose_dtype
    from shardinfer.shard.device_loop import prepare_batches
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.task import Generate

    context = LoadContext(settings, torch.device("cpu"), choose_dtype(settings.model.dtype, torch.device("cpu")))
    engine = VllmGenerate.load(Generate, context)
    task = engine.task
    texts = pd.read_parquet(settings.input.path)["text"].tolist()

    def windows(size: int) -> list:
        prepared = [task.prepare(first, pa.table({"text": texts[first:first + size]}))
                    for first in range(0, len(texts), size)]
        return [(w, w, prepare_batches(engine, w, pa.table({}), settings.batch).batches) for w in prepared]

    prepared = {256: windows(256), len(texts): windows(len(texts))}
    ids = [row for _, w, _ in prepared[len(texts)] for row in w.data.ids]

    def fed(size: int) -> list:
        items = iter(prepared[size])
        fed_windows = engine.feed(lambda wait: next(items, None), False)
        return [r for _, results, _ in fed_windows for r in results["completions"]]

    def bare() -> list:
        params = [engine.sampling_params(task.params, row) for row in range(len(ids))]
        return engine.llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=False)

    seconds = {"bare": [], "fed, windows of 256": [], "fed, one window": []}
    tokens, work = {}, {}
    engine_counts.count_schedules()
    with torch.inference_mode():
        for _ in range(repeats):
            for name, run in (("bare", bare), ("fed, windows of 256", lambda: fed(256)),
                              ("fed, one window", lambda: fed(len(texts)))):
                engine.llm.reset_prefix_cache()
                engine_counts.reset()
                started = time.perf_counter()
                out = run()
                seconds[name].append(time.perf_counter() - started)
                work[name] = engine_counts.taken()
                tokens[name] = [list(o.outputs[0].token_ids) for o in out] if name == "bare" else \
                    [c[0].tokens.tolist() for c in out]
    best = {name: min(each) for name, each in seconds.items()}
    print(f"\nin one process, one engine, {repeats} interleaved runs each (best counts):")
    for name, each in seconds.items():
        print(f"  {name:22} {best[name]:7.2f} s  {best['bare'] / best[name]:.3f}x bare   paired "
              f"{median_ratio(seconds['bare'], each)}   "
              f"runs {'/'.join(f'{t:.1f}' for t in each)}   same tokens as bare: {tokens[name] == tokens['bare']}")
        print(f"  {'':22} engine work: {engine_counts.line(work[name])}")


def report(runs: dict, settings, bad_rows: list[int], rows: int) -> None:
    best = {name: min(generating(run) for run in each) for name, each in runs.items()}
    wall = {name: min(run["wall"] for run in each) for name, each in runs.items()}
    bare_tokens = runs["bare"][-1]["tokens"]
    generated = np.array([len(t) for t in bare_tokens])
    print(f"\n{rows} prompts, max_new_tokens {settings.model.max_new_tokens}, greedy; generated per row "
          f"{generated.min()}..{generated.max()} (median {int(np.median(generated))}), "
          f"{int((generated < settings.model.max_new_tokens).sum())} rows ended early on eos")
    seconds = {name: [generating(run) for run in each] for name, each in runs.items()}
    print(f"{'':18}{'generating s':>14}{'x bare':>9}{'wall s':>9}   {'x bare, paired':42}each repeat (generating)")
    for name in ("bare", "window 256", "default window", "bad prompts"):
        each = "/".join(f"{value:.1f}" for value in seconds[name])
        paired = median_ratio(seconds["bare"], seconds[name])
        print(f"{name:18}{best[name]:>14.2f}{best['bare'] / best[name]:>9.3f}{wall[name]:>9.1f}   {paired:42}{each}")
    for name in ("bare", "window 256", "default window", "bad prompts"):
        print(f"engine work, {name}: {engine_counts.line(runs[name][-1].get('engine'))}")
    for name in ("window 256", "default window"):
        frame = runs[name][-1]["frame"]
        same = sum(a == b for a, b in zip(frame["n_generated_tokens"], generated))
        print(f"{name}: rows/s {rows / best[name]:.1f} = {best['bare'] / best[name]:.3f}x bare LLM.generate; "
              f"{same} of {rows} rows generate as many tokens as bare")
    frame = runs["bad prompts"][-1]["frame"]
    failed = frame.loc[frame["error"].notna(), "index"].tolist()
    print(f"bad prompts: {len(failed)} rows failed {failed} (planted: {bad_rows}); time against the good prompts "
          f"{best['bad prompts'] / best['default window']:.3f}x generating (paired: "
          f"{median_ratio(seconds['bad prompts'], seconds['default window'])}), "
          f"{wall['bad prompts'] / wall['default window']:.3f}x wall")
    print(json.dumps({"first_error": frame.loc[frame["error"].notna(), "error"].head(1).tolist()}))
