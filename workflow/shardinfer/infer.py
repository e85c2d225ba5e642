"""One shard: read its range → tokenize → length-sorted batches → run the task → write atomically.

Every stage but the device loop runs in a background worker (`shardinfer.pipeline`), so the
device does not wait on reading, tokenizing or building tensors when the CPU keeps up.

Reads top to bottom like a sampling script. The shard file carries the global row number in an
`index` column and, in its metadata, the plan and settings it was made under, so gather can
prove it belongs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import torch

from shardinfer.atomic import atomic_parquet_writer
from shardinfer.batching import length_sorted_batches, pad_batch, padded_tokens
from shardinfer.config import IDENTITY_KEY, INDEX_COLUMN, STATS_KEY, BatchSettings, Settings
from shardinfer.content import ContentHasher
from shardinfer.errors import UserError
from shardinfer.lease import Lease, acquire_device, default_wait_s
from shardinfer.models import choose_device, choose_dtype, load_model, load_tokenizer, settle_pad_token
from shardinfer.pipeline import Pipeline
from shardinfer.progress import Progress
from shardinfer.plan import Plan, read_plan
from shardinfer.tables import iter_input, iter_range, windows
from shardinfer.tasks import load_task
from shardinfer.tokens import (Encoder, TokenWindow, check_token_file, read_token_windows, token_identity,
                               tokenize_window)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardJob:
    settings: Settings
    plan_path: str
    shard: int
    output: str
    digest: str
    threads: int = 1
    tokens: str | None = None  # the tokenize rule's file for this shard, when tokenizing ahead
    tokenizer_key: str | None = None


@dataclass
class Counters:
    rows: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    truncated_rows: list[int] = field(default_factory=list)
    lengths: Counter = field(default_factory=Counter)  # rows per real token length, for the report's histogram

    def count_tokens(self, lengths: list[int], batches: list[np.ndarray], tokens: TokenWindow) -> None:
        self.real_tokens += sum(lengths)
        self.lengths.update(lengths)
        self.padded_tokens += padded_tokens(lengths, batches)
        self.truncated += len(tokens.truncated)
        self.truncated_rows.extend(tokens.first + i for i in tokens.truncated[: 5 - len(self.truncated_rows)])

    def stats(self, seconds: float, runtime: Runtime) -> dict:
        return {"rows": self.rows, "seconds": round(seconds, 3), "device": runtime.where, "dtype": runtime.dtype,
                "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens,
                "padding_ratio": round(self.padded_tokens / max(self.real_tokens, 1), 4),
                "truncated": self.truncated, "first_truncated_rows": self.truncated_rows,
                "token_lengths": {str(n): self.lengths[n] for n in sorted(self.lengths)}}


@dataclass(frozen=True)
class Prepared:
    """A window ready for the device: its rows' ids and batches with host tensors built ahead."""

    tokens: TokenWindow
    keep: pa.Table  # the window's keep columns, written beside the results
    batches: list[tuple[np.ndarray, dict[str, torch.Tensor]]]  # (window positions, tensors)


class Batcher:
    """Token ids → length-sorted batches → padded host tensors (pinned when bound for a GPU)."""

    def __init__(self, tokenizer, pad_id: int, batch: BatchSettings, pin: bool) -> None:
        self.pad_id = pad_id
        self.left = tokenizer.padding_side == "left"
        self.with_token_types = "token_type_ids" in tokenizer.model_input_names
        self.batch = batch
        self.pin = pin

    def tensors(self, ids: list) -> dict[str, torch.Tensor]:
        input_ids, mask = pad_batch([row if len(row) else [self.pad_id] for row in ids], self.pad_id, self.left)
        inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if self.with_token_types:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        return {name: t.pin_memory() for name, t in inputs.items()} if self.pin else inputs

    def prepare(self, tokens: TokenWindow, keep: pa.Table, counters: Counters) -> Prepared:
        lengths = [max(len(row), 1) for row in tokens.ids]
        planned = length_sorted_batches(lengths, self.batch.max_tokens, self.batch.max_rows)
        counters.count_tokens(lengths, planned, tokens)
        batches = [(positions, self.tensors([tokens.ids[p] for p in positions])) for positions in planned]
        return Prepared(tokens, keep, batches)


def predict_splitting(task, batcher: Batcher, ids: list, positions: np.ndarray, inputs, device, first_row: int):
    """Yield (positions, outputs); a batch that runs out of device memory is halved and retried.

    Down to a single row: if that still does not fit, the job fails naming the row.
    """
    try:
        inputs = inputs if inputs is not None else batcher.tensors([ids[p] for p in positions])
        outputs = task.predict({name: t.to(device, non_blocking=True) for name, t in inputs.items()})
    except torch.OutOfMemoryError:
        outputs = None
    if outputs is not None:
        yield positions, start_copy_back(outputs, device)
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()  # outside `except`, whose traceback would keep the failed batch alive
    if len(positions) == 1:
        row = first_row + int(positions[0])
        raise UserError(f"row {row} ({max(len(ids[positions[0]]), 1)} tokens) does not fit in device memory even "
                        "alone; lower model.max_length or use a device with more memory")
    width = max(len(ids[p]) for p in positions)
    log.warning("out of memory on a batch of %d rows x %d tokens; splitting it in two", len(positions), width)
    half = len(positions) // 2
    yield from predict_splitting(task, batcher, ids, positions[:half], None, device, first_row)
    yield from predict_splitting(task, batcher, ids, positions[half:], None, device, first_row)


@dataclass(frozen=True)
class CopyBack:
    """A batch's outputs on their way to host memory; `ready` waits for them."""

    outputs: dict
    done: object = None  # a CUDA event recorded after the copies, or None when already on the host

    def ready(self) -> dict[str, np.ndarray]:
        if self.done is not None:
            self.done.synchronize()
        return {name: v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for name, v in self.outputs.items()}


def start_copy_back(outputs: dict, device) -> CopyBack:
    """On a GPU, queue the copies into pinned host memory right behind the batch's own kernels,
    so that waiting for them later does not also wait for the batch queued after it."""
    if device.type != "cuda":
        return CopyBack({name: v.cpu() if isinstance(v, torch.Tensor) else v for name, v in outputs.items()})
    host = {}
    for name, values in outputs.items():
        host[name] = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host[name].copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return CopyBack(host, done)


def predict_window(task, batcher: Batcher, window: Prepared, device) -> dict[str, np.ndarray]:
    """Run one window's batches on the device; results come back in the rows' order.

    A batch's results are collected only after the next batch is queued: one batch in flight,
    so the device has work while the host stores results and starts the next batch.
    """
    ids, rows = window.tokens.ids, len(window.tokens.ids)
    results: dict[str, np.ndarray] = {}

    def store(positions: np.ndarray, copy: CopyBack) -> None:
        for name, values in copy.ready().items():
            if name not in results:
                results[name] = np.empty((rows, *values.shape[1:]), dtype=values.dtype)
            results[name][positions] = values

    in_flight = None
    for planned, inputs in window.batches:
        for done in predict_splitting(task, batcher, ids, planned, inputs, device, window.tokens.first):
            if in_flight is not None:
                store(*in_flight)
            in_flight = done
    if in_flight is not None:
        store(*in_flight)
    return results


def shard_schema(task, keep_schema: pa.Schema, identity: dict) -> pa.Schema:
    fields = [pa.field(INDEX_COLUMN, pa.int64()), *keep_schema, *task.output_schema()]
    return pa.schema(fields, metadata={IDENTITY_KEY: json.dumps(identity).encode()})


def keep_schema_of(settings: Settings) -> pa.Schema:
    """The keep columns' types, read from the input's own schema: the fields after the text column
    (by position, as the text column may be kept too and then appears twice)."""
    first = next(iter(iter_input(settings.input)))
    return pa.schema(list(first.schema)[1:])


@dataclass
class Runtime:
    task: object
    encoder: Encoder
    batcher: Batcher
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
    encoder = Encoder(tokenizer, settings.model.max_length)
    batcher = Batcher(tokenizer, pad_id, settings.batch, pin=device.type == "cuda")
    return Runtime(task, encoder, batcher, device, where, str(dtype).replace("torch.", ""))


def first_window(sort_window: int) -> int:
    """A short first window: the device starts after 1/16 of a window is tokenized, not all of it."""
    return max(1, sort_window // 16)


def read_windows(job: ShardJob, plan: Plan) -> Iterator[tuple[int, pa.Table]]:
    start, end = plan.ranges[job.shard]
    size = job.settings.batch.sort_window
    return windows(iter_range(job.settings.input, start, end), size, first_window(size))


def tokenized(job: ShardJob, plan: Plan, encoder: Encoder, pipeline: Pipeline):
    """A queue of (token window, keep columns): tokenized in a worker, or read from the tokenize
    rule's file beside the input's keep columns."""
    null_as_empty = job.settings.input.null_text == "empty"
    read = pipeline.source("read", read_windows(job, plan))
    if job.tokens is None:
        def tokenize(item):
            first, table = item
            return tokenize_window(encoder, first, table, null_as_empty), table.remove_column(0)  # keep columns

        return pipeline.map("tokenize", tokenize, read)
    size = job.settings.batch.sort_window
    made = read_token_windows(job.tokens, size, first_window(size))

    def pair(item):
        first, table = item
        tokens = next(made, None)
        if tokens is None or tokens.first != first or len(tokens.ids) != table.num_rows:
            raise UserError(f"token file `{job.tokens}` does not line up with the input at row {first}; "
                            "delete it and rerun")
        return tokens, table.remove_column(0)  # by position: a kept text column has the same name

    return pipeline.map("read tokens", pair, read)


def write_shard(job: ShardJob, plan: Plan, runtime: Runtime, began: float) -> dict:
    """Stream the shard's rows through the task into its file; returns the shard's stats.

    read → tokenize (or read token ids) → batch and build tensors run in workers, the device
    loop in this thread, and writing in another worker; each hands on through a bounded queue.
    The stats carry each stage's busy seconds and the job's wall-clock span (from `began`, the
    epoch time the job started, to the file complete), so gather can time the run end to end.
    Each table written is hashed too: gather checks its values against that digest (`content`).
    """
    settings, task = job.settings, runtime.task
    start, end = plan.ranges[job.shard]
    identity = {"plan_id": plan.plan_id, "shard": job.shard, "start": start, "end": end,
                "digest": job.digest, "task": settings.model.task}
    schema = shard_schema(task, keep_schema_of(settings), identity)
    counters, started, progress = Counters(), time.perf_counter(), Progress(end - start)
    content = ContentHasher()  # every column the file holds, as written

    with atomic_parquet_writer(job.output, schema) as writer, torch.inference_mode(), Pipeline() as pipeline:
        def write(item):
            first, keep, results = item
            index = pa.array(np.arange(first, first + keep.num_rows, dtype=np.int64))
            table = pa.Table.from_arrays([index, *keep.columns, *task.to_arrow(results)], schema=schema)
            writer.write_table(table)
            content.update(table)
            counters.rows += keep.num_rows
            progress.advance(keep.num_rows)

        tokens = tokenized(job, plan, runtime.encoder, pipeline)
        prepared = pipeline.map("batch", lambda item: runtime.batcher.prepare(*item, counters), tokens)
        output = pipeline.sink("write", write)
        for window in pipeline.drain("device", prepared):
            results = predict_window(task, runtime.batcher, window, runtime.device)
            pipeline.put(output, (window.tokens.first, window.keep, results))  # not the window's tensors
        pipeline.finish(output)
        log.info("%s", pipeline.report())
        stats = counters.stats(time.perf_counter() - started, runtime)
        stats["bound_by"] = pipeline.bottleneck().name
        stats["stages"] = pipeline.busy_seconds()
        stats["started"], stats["ended"] = round(began, 3), round(time.time(), 3)
        writer.add_key_value_metadata({STATS_KEY: json.dumps(stats), **content.metadata()})
    return stats


def run_shard(job: ShardJob) -> dict:
    """The infer rule: the shard's rows through the model into `job.output`, atomically."""
    began = time.time()
    plan = read_plan(job.plan_path)
    plan.check_input_unchanged()
    start, end = plan.ranges[job.shard]
    log.info("shard %d of %d: rows [%d, %d) of %s", job.shard, plan.shards, start, end, plan.input_path)
    if job.tokens is not None:  # refuse token ids of another plan or tokenizer before loading anything
        check_token_file(job.tokens, token_identity(plan, job.shard, job.tokenizer_key))
    os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))  # the tokenizer's threads: this job's share
    lease = acquire_device(wait_s=default_wait_s())
    lease.export()
    try:
        stats = write_shard(job, plan, start_runtime(job.settings, lease, job.threads), began)
    finally:
        lease.release()
    if stats["truncated"]:
        log.info("%d text(s) longer than max_length=%d were truncated (first rows: %s)",
                 stats["truncated"], job.settings.model.max_length, stats["first_truncated_rows"])
    log.info("wrote %s: %d rows in %.1f s (%.0f rows/s), padding ratio %.3f", job.output, stats["rows"],
             stats["seconds"], stats["rows"] / max(stats["seconds"], 1e-9), stats["padding_ratio"])
    return stats
