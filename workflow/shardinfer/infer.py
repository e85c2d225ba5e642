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
from shardinfer.config import IDENTITY_KEY, INDEX_COLUMN, STATS_KEY, BatchSettings, Settings
from shardinfer.errors import UserError
from shardinfer.lease import Lease, acquire_device, default_wait_s
from shardinfer.models import choose_device, choose_dtype, load_model, load_tokenizer, settle_pad_token
from shardinfer.plan import Plan, read_plan
from shardinfer.tables import iter_input, iter_range, text_values
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

    def stats(self, seconds: float, runtime: Runtime) -> dict:
        return {"rows": self.rows, "seconds": round(seconds, 3), "device": runtime.where, "dtype": runtime.dtype,
                "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens,
                "padding_ratio": round(self.padded_tokens / max(self.real_tokens, 1), 4),
                "truncated": self.truncated, "first_truncated_rows": self.truncated_rows}


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

    def __init__(self, tokenizer, max_length: int, pad_id: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.with_token_types = "token_type_ids" in tokenizer.model_input_names
        self.pad_id = pad_id
        self.left = tokenizer.padding_side == "left"

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length, add_special_tokens=True)["input_ids"]
        ids = [row or [self.pad_id] for row in ids]  # tokenizers without special tokens give [] for ""
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


def predict_splitting(task, encoder: Encoder, ids: list[list[int]], positions: np.ndarray, device, first_row: int):
    """Yield (positions, outputs); a batch that runs out of device memory is halved and retried.

    Down to a single row: if that still does not fit, the job fails naming the row.
    """
    try:
        yield positions, task.predict(encoder.tensors([ids[p] for p in positions], device))
        return
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if len(positions) == 1:
        row = first_row + int(positions[0])
        raise UserError(f"row {row} ({len(ids[positions[0]])} tokens) does not fit in device memory even alone; "
                        "lower model.max_length or use a device with more memory")
    width = max(len(ids[p]) for p in positions)
    log.warning("out of memory on a batch of %d rows x %d tokens; splitting it in two", len(positions), width)
    half = len(positions) // 2
    yield from predict_splitting(task, encoder, ids, positions[:half], device, first_row)
    yield from predict_splitting(task, encoder, ids, positions[half:], device, first_row)


def predict_window(task, encoder: Encoder, texts: list[str], first_row: int, batch: BatchSettings, device,
                   counters: Counters) -> tuple[dict[str, np.ndarray], list[int]]:
    """Run one window's rows in length-sorted batches; results come back in the rows' order,
    with the window positions of truncated texts."""
    ids, truncated = encoder.encode(texts)
    lengths = [len(row) for row in ids]
    batches = length_sorted_batches(lengths, batch.max_tokens, batch.max_rows)
    results: dict[str, np.ndarray] = {}
    for planned in batches:
        for positions, outputs in predict_splitting(task, encoder, ids, planned, device, first_row):
            for name, values in outputs.items():
                if name not in results:
                    results[name] = np.empty((len(texts), *values.shape[1:]), dtype=values.dtype)
                results[name][positions] = values
    counters.real_tokens += sum(lengths)
    counters.padded_tokens += round(padding_ratio(lengths, batches) * sum(lengths))
    counters.truncated += len(truncated)
    return results, truncated


def shard_schema(task, keep_schema: pa.Schema, identity: dict) -> pa.Schema:
    fields = [pa.field(INDEX_COLUMN, pa.int64()), *keep_schema, *task.output_schema()]
    return pa.schema(fields, metadata={IDENTITY_KEY: json.dumps(identity).encode()})


def keep_schema_of(settings: Settings) -> pa.Schema:
    """The keep columns' types, read from the input's own schema."""
    first = next(iter(iter_input(settings.input)))
    return pa.schema([first.schema.field(c) for c in settings.input.keep_columns])


@dataclass
class Runtime:
    task: object
    encoder: Encoder
    device: torch.device
    where: str
    dtype: str


def start_runtime(settings: Settings, lease: Lease, threads: int) -> Runtime:
    """Pick device and precision, then load tokenizer, model and adapter for the task."""
    device = choose_device(threads)
    dtype = choose_dtype(settings.model.dtype, device)
    if device.type == "cuda":
        where = f"cuda (CUDA_VISIBLE_DEVICES={lease.visible}, {torch.cuda.get_device_name(device)})"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    log.info("running on %s in %s", where, dtype)
    loaded_at = time.perf_counter()
    task_class = load_task(settings.model.task)
    tokenizer = load_tokenizer(settings.model)
    loaded = load_model(settings.model, task_class.auto_class, dtype, device)
    pad_id = settle_pad_token(tokenizer, loaded.model)
    task = task_class(loaded, settings.model)
    adapter = f" + adapter {settings.model.adapter}" if settings.model.adapter else ""
    log.info("loaded %s%s in %.1f s", settings.model.path, adapter, time.perf_counter() - loaded_at)
    encoder = Encoder(tokenizer, settings.model.max_length, pad_id)
    return Runtime(task, encoder, device, where, str(dtype).replace("torch.", ""))


def write_shard(job: ShardJob, plan: Plan, runtime: Runtime) -> dict:
    """Stream the shard's rows through the task into its file; returns the shard's stats."""
    settings, task = job.settings, runtime.task
    start, end = plan.ranges[job.shard]
    identity = {"plan_id": plan.plan_id, "shard": job.shard, "start": start, "end": end,
                "digest": job.digest, "task": settings.model.task}
    schema = shard_schema(task, keep_schema_of(settings), identity)
    counters, started = Counters(), time.perf_counter()
    with torch.inference_mode(), atomic_parquet_writer(job.output, schema) as writer:
        for first, table in windows(iter_range(settings.input, start, end), settings.batch.sort_window):
            texts = text_values(table.column(0).combine_chunks(), settings.input.null_text == "empty")
            results, truncated = predict_window(task, runtime.encoder, texts, first, settings.batch, runtime.device, counters)
            counters.truncated_rows.extend(first + i for i in truncated[: 5 - len(counters.truncated_rows)])
            index = pa.array(np.arange(first, first + table.num_rows, dtype=np.int64))
            writer.write_table(pa.Table.from_arrays([index, *table.columns[1:], *task.to_arrow(results)], schema=schema))
            counters.rows += table.num_rows
            log.info("rows %d/%d, %.0f rows/s", counters.rows, end - start, counters.rows / (time.perf_counter() - started))
        stats = counters.stats(time.perf_counter() - started, runtime)
        writer.add_key_value_metadata({STATS_KEY: json.dumps(stats)})
    return stats


def run_shard(job: ShardJob) -> dict:
    """The infer rule: the shard's rows through the model into `job.output`, atomically."""
    plan = read_plan(job.plan_path)
    plan.check_input_unchanged()
    start, end = plan.ranges[job.shard]
    log.info("shard %d of %d: rows [%d, %d) of %s", job.shard, plan.shards, start, end, plan.input_path)
    lease = acquire_device(wait_s=default_wait_s())
    lease.export()
    try:
        stats = write_shard(job, plan, start_runtime(job.settings, lease, job.threads))
    finally:
        lease.release()
    if stats["truncated"]:
        log.info("%d text(s) longer than max_length=%d were truncated (first rows: %s)",
                 stats["truncated"], job.settings.model.max_length, stats["first_truncated_rows"])
    log.info("wrote %s: %d rows in %.1f s (%.0f rows/s), padding ratio %.3f", job.output, stats["rows"],
             stats["seconds"], stats["rows"] / max(stats["seconds"], 1e-9), stats["padding_ratio"])
    return stats
