"""What the generation feature tests share (tests/test_generation.py, test_generation_units.py and
the vLLM probe, tests/generation_probe.py): conversations, a JSON schema the tiny byte-level Llama
can complete, the runs' configs, and one window of rows through a task as a shard job runs it."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa

from factory import WORDS

ROWS = 24
MAX_LENGTH, NEW_TOKENS = 48, 20
LONG_ROW = 5  # a conversation far longer than MAX_LENGTH
# Enum and bounded integers: the tiny model's JSON ends on eos often within 20 tokens, and is cut by
# max_new_tokens otherwise (a string without bounds would rarely close: the random weights seldom pick a quote).
SCHEMA = {"type": "object", "properties": {"label": {"enum": ["yes", "no", "maybe"]},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["label", "age"], "additionalProperties": False}
CHOICES = ["positive", "negative", "neutral"]
JSON = {"json": SCHEMA, "whitespace": "compact"}
SAMPLED = {"do_sample": True, "seed": 7, "temperature": 1.2, "n": 2, "logprobs": 1, "structured": JSON}


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def conversations(rows: int = ROWS, seed: int = 5) -> list[list[dict]]:
    """Conversations of one to three turns, every third with a system message; row LONG_ROW has six
    turns, far beyond MAX_LENGTH."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        messages = [{"role": "system", "content": "answer in json"}] if i % 3 == 0 else []
        for turn in range(1 + i % 3):
            messages.append({"role": "user", "content": words(rng, 1, 8)})
            if turn < i % 3:
                messages.append({"role": "assistant", "content": words(rng, 1, 5)})
        out.append(messages)
    out[LONG_ROW] = [{"role": "system", "content": "be brief"}, *[
        message for k in range(6) for message in ({"role": "user", "content": " ".join(WORDS[k:k + 8])},
                                                  {"role": "assistant", "content": "ok " * 5})],
                     {"role": "user", "content": "the end"}]
    return out


def as_text_parts(conversation: list[dict], split: bool = False) -> list[dict]:
    """Each content as one text part; `split`: a content of several words as two parts, its first
    word and the rest (their texts joined are the content)."""
    def parts(text: str) -> list[dict]:
        cut = text.find(" ") if split else -1
        pieces = [text[:cut], text[cut:]] if cut > 0 else [text]
        return [{"type": "text", "text": piece} for piece in pieces]

    return [{**message, "content": parts(message["content"])} for message in conversation]


def write_conversations(path: Path, rows: int = ROWS, parts: bool = False) -> Path:
    """The conversations with an `id` column, as Parquet (list<struct>) or JSONL (arrays of objects);
    `parts`: each content a list of text parts (HF's chat format), row 1's in two parts."""
    import json

    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    values = conversations(rows)
    if parts:
        values = [as_text_parts(conversation, split=i == 1) for i, conversation in enumerate(values)]
    if path.suffix == ".parquet":
        pq.write_table(pa.table({"id": [f"c{i}" for i in range(rows)], "messages": values}), path)
    else:
        path.write_text("".join(json.dumps({"id": f"c{i}", "messages": m}) + "\n" for i, m in enumerate(values)))
    return path


def generation_config(data: Path, lm: Path, shards: int, engine: str, **options) -> dict:
    config = {"input": {"path": str(data), "messages_column": "messages", "keep_columns": ["id"]},
              "model": {"path": str(lm), "task": "generate", "max_length": MAX_LENGTH, "max_new_tokens": NEW_TOKENS,
                        "dtype": "float32"},
              "generate": {"engine": engine, **options}, "batch": {"max_tokens": 4096, "max_rows": 4, "sort_window": 8},
              "shards": shards}
    if engine == "vllm":
        config["generate"]["vllm"] = {"max_num_seqs": 16}
    return config


def run_window(runner, table: pa.Table, first: int = 0, params=None, max_rows: int = 4) -> pa.Table:
    """Rows through a task as a shard job runs them (one window, its batches, the device loop), each
    row with the task's parameters or `params` (a RowParams for every row, or one per row).
    `runner`: the task, on the transformers engine, or an engine (vLLM's)."""
    import dataclasses

    import torch

    from shardinfer.engines.base import Engine
    from shardinfer.engines.transformers import Transformers
    from shardinfer.settings.config import BatchSettings
    from shardinfer.shard.device_loop import predict_window, prepare_batches

    engine = runner if isinstance(runner, Engine) else Transformers(runner)
    task = engine.task

    with torch.inference_mode():
        window = task.prepare(first, table)
        if params is not None:
            rows = params if isinstance(params, list) else [params] * window.rows
            window = dataclasses.replace(window, data=dataclasses.replace(window.data, params=rows))
        prepared = prepare_batches(engine, window, pa.table({}), BatchSettings(10_000, max_rows, 64))
        results = predict_window(engine, prepared, torch.device("cpu"))
        columns = task.to_arrow(results, np.arange(first, first + window.rows))
    return pa.table(columns, names=list(task.columns))


def settings_of(workdir: Path):
    """The settings of a run's config, built as the Snakefile builds them."""
    import yaml
    from snakemake.utils import validate

    from shardinfer.settings.schema import SCHEMA_PATH
    from shardinfer.snakefile.configure import settings_by_input

    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    validate(config, str(SCHEMA_PATH))
    return settings_by_input(config)[None]
