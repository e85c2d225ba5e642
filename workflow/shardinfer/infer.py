"""One shard: read its range → tokenize → length-sorted batches → run the task → write atomically.

Reads top to bottom like a sampling script. The shard file carries the global row number in an
`index` column and, in its metadata, the plan and settings it was made under, so gather can
prove it belongs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import torch

from shardinfer.atomic import atomic_parquet_writer
from shardinfer.batching import length_sorted_batches, pad_batch, padding_ratio
from shardinfer.config import IDENTITY_KEY, INDEX_COLUMN, STATS_KEY, Settings
from shardinfer.lease import acquire_device, default_wait_s
from shardinfer.models import choose_device, choose_dtype, load_model, load_tokenizer
from shardinfer.plan import read_plan
from shardinfer.tables import iter_range, text_values
from shardinfer.tasks import load_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardJob:
    settings: Settings
    plan_path: str
    shard: int
    output: str
    digest: str
    threads: int = 1


@dataclass
class Counters:
    rows: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    truncated_rows: list[int] = field(default_factory=list)


def windows(batches: Iterator[tuple[int, pa.RecordBatch]], size: int) -> Iterator[tuple[int, pa.Table]]:
    """Regroup the reader's batches into tables of `size` rows (the last may be shorter)."""
    pending, first = [], None
    for start, batch in batches:
        first = start if first is None else first
        pending.append(batch)
        table = pa.Table.from_batches(pending)
        while table.num_rows >= size:
            yield first, table.slice(0, size)
            first, table = first + size, table.slice(size)
        pending = table.to_batches()
    if pending and sum(b.num_rows for b in pending) > 0:
        yield first, pa.Table.from_batches(pending)


class Encoder:
    """Tokenizes without padding; counts texts cut at max_length."""

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.with_token_types = "token_type_ids" in tokenizer.model_input_names
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.left = tokenizer.padding_side == "left"

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length, add_special_tokens=True)["input_ids"]
        at_limit = [i for i, row in enumerate(ids) if len(row) >= self.max_length]
        truncated = []
        if at_limit:
            full = self.tokenizer([texts[i] for i in at_limit], add_special_tokens=True)["input_ids"]
            truncated = [i for i, row in zip(at_limit, full) if len(row) > self.max_length]
        return ids, truncated

    def tensors(self, ids: list[list[int]], device: torch.device) -> dict[str, torch.Tensor]:
        input_ids, mask = pad_batch(ids, self.pad_id, self.left)
        inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if self.with_token_types:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        return {name: tensor.to(device, non_blocking=True) for name, tensor in inputs.items()}


def predict_window(task, encoder: Encoder, texts: list[str], job: ShardJob, device, counters: Counters) -> tuple[dict[str, np.ndarray], list[int]]:
    """Run one window's rows in length-sorted batches; results come back in the rows' order,
    with the window positions of truncated texts."""
    ids, truncated = encoder.encode(texts)
    lengths = [len(row) for row in ids]
    batches = length_sorted_batches(lengths, job.settings.batch.max_tokens, job.settings.batch.max_rows)
    results: dict[str, np.ndarray] = {}
    for positions in batches:
        outputs = task.predict(encoder.tensors([ids[p] for p in positions], device))
        for name, values in outputs.items():
            if name not in results:
                results[name] = np.empty((len(texts), *values.shape[1:]), dtype=values.dtype)
            results[name][positions] = values
    counters.real_tokens += sum(lengths)
    counters.padded_tokens += round(padding_ratio(lengths, batches) * sum(lengths))
    counters.truncated += len(truncated)
    return results, truncated


def shard_schema(job: ShardJob, task, keep_schema: pa.Schema, identity: dict) -> pa.Schema:
    fields = [pa.field(INDEX_COLUMN, pa.int64()), *keep_schema, *task.output_schema()]
    return pa.schema(fields, metadata={IDENTITY_KEY: json.dumps(identity).encode()})


def keep_schema_of(settings: Settings) -> pa.Schema:
    """The keep columns' types, read from the input's own schema."""
    from shardinfer.tables import iter_input

    first = next(iter(iter_input(settings.input)))
    return pa.schema([first.schema.field(c) for c in settings.input.keep_columns])


def run_shard(job: ShardJob) -> dict:
    """The infer rule: the shard's rows through the model into `job.output`, atomically."""
    settings = job.settings
    plan = read_plan(job.plan_path)
    plan.check_input_unchanged()
    start, end = plan.ranges[job.shard]
    log.info("shard %d of %d: rows [%d, %d) of %s", job.shard, plan.shards, start, end, plan.input_path)

    lease = acquire_device(wait_s=default_wait_s())
    lease.export()
    device = choose_device(job.threads)
    dtype = choose_dtype(settings.model.dtype, device)
    where = f"cuda (CUDA_VISIBLE_DEVICES={lease.visible}, {torch.cuda.get_device_name(device)})" if device.type == "cuda" \
        else f"cpu ({torch.get_num_threads()} threads)"
    log.info("running on %s in %s", where, str(dtype).replace("torch.", ""))

    loaded_at = time.perf_counter()
    task_class = load_task(settings.model.task)
    tokenizer = load_tokenizer(settings.model)
    task = task_class(load_model(settings.model, task_class.auto_class, dtype, device), settings.model)
    encoder = Encoder(tokenizer, settings.model.max_length)
    log.info("loaded %s%s in %.1f s", settings.model.path,
             f" + adapter {settings.model.adapter}" if settings.model.adapter else "", time.perf_counter() - loaded_at)

    identity = {"plan_id": plan.plan_id, "shard": job.shard, "start": start, "end": end,
                "digest": job.digest, "task": settings.model.task}
    counters = Counters()
    started = time.perf_counter()
    schema = shard_schema(job, task, keep_schema_of(settings), identity)
    with torch.inference_mode(), atomic_parquet_writer(job.output, schema) as writer:
        for first, table in windows(iter_range(settings.input, start, end), settings.batch.sort_window):
            texts = text_values(table.column(0).combine_chunks(), settings.input.null_text == "empty")
            results, truncated = predict_window(task, encoder, texts, job, device, counters)
            counters.truncated_rows.extend(first + i for i in truncated[: 5 - len(counters.truncated_rows)])
            index = pa.array(np.arange(first, first + table.num_rows, dtype=np.int64))
            columns = [index, *table.columns[1:], *task.to_arrow(results)]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
            counters.rows += table.num_rows
            log.info("rows %d/%d, %.0f rows/s", counters.rows, end - start, counters.rows / max(time.perf_counter() - started, 1e-9))
        seconds = time.perf_counter() - started
        stats = {"rows": counters.rows, "seconds": round(seconds, 3), "device": where, "dtype": str(dtype).replace("torch.", ""),
                 "real_tokens": counters.real_tokens, "padded_tokens": counters.padded_tokens,
                 "truncated": counters.truncated, "first_truncated_rows": counters.truncated_rows}
        writer.add_key_value_metadata({STATS_KEY: json.dumps(stats)})
    if counters.truncated:
        log.info("%d text(s) longer than max_length=%d were truncated (first rows: %s)",
                 counters.truncated, settings.model.max_length, counters.truncated_rows)
    log.info("wrote %s: %d rows in %.1f s (%.0f rows/s), padding ratio %.3f", job.output, counters.rows, seconds,
             counters.rows / max(seconds, 1e-9), counters.padded_tokens / max(counters.real_tokens, 1))
    lease.release()
    return stats
