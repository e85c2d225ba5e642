"""One shard: read its range → the task prepares rows → length-sorted batches → the device →
write atomically.

Every stage but the device loop runs in a background worker (`shardinfer.shard.pipeline`), so the
device does not wait on reading, tokenizing or building inputs when the CPU keeps up. The runner
knows no task by name: it asks the task (`shardinfer.tasks.base`) to load, prepare, collate,
predict and name its columns.

Reads top to bottom like a sampling script. The shard file carries the global row number in an
`index` column and, in its metadata, the plan and settings it was made under, so gather can
prove it belongs (`shardinfer.contract.shard_file`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import torch

from shardinfer.atomic import atomic_parquet_writer
from shardinfer.config import BatchSettings, Settings
from shardinfer.contract.content_digest import ContentHasher
from shardinfer.batching import batch_budget
from shardinfer.shard.device_loop import RowErrors, predict_window, prepare_batches
from shardinfer.errors import UserError
from shardinfer.contract.row_files import staging_folder
from shardinfer.shard.row_files import ShardFiles, staged_files
from shardinfer.devices import Lease, acquire_device, default_wait_s
from shardinfer.hf.models import choose_device, choose_dtype
from shardinfer.shard.pipeline import Pipeline
from shardinfer.plan import Plan, read_plan
from shardinfer.shard.progress import Progress
from shardinfer.hf.transformers_import import hide_sklearn_from_transformers
from shardinfer.contract.shard_file import ERROR_COLUMN, STATS_KEY, computed, file_columns, shard_schema
from shardinfer.shard.resume import (assemble, commit_window, keep_committed, left_for_rerun, remove_windows,
                                     windows_folder)
from shardinfer.shard.stop import Terminated, stop_on_sigterm
from shardinfer.input.parts import windows
from shardinfer.tasks import engine_class, task_class
from shardinfer.tasks.base import LoadContext, Task, Window
from shardinfer.hf.tokens import check_token_file, token_identity

log = logging.getLogger(__name__)
FIRST_ROWS = 10  # truncated rows a shard lists by row number, for the terminal's run-wide first ones


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
    files: str | None = None  # the shard's folder of per-row files (results/files/<shard>), when the task may write any
    cut: str | None = None  # the shard's cut, read instead of the input without a shared filesystem (input.shard_cuts)


@dataclass(frozen=True)
class WindowCost:
    """A window's real and padded cost (tokens for text tasks), its rows per real length and its
    truncated rows: counted when its batches are cut, added to the tally when it is written."""

    real_tokens: int
    padded_tokens: int
    lengths: Counter
    truncated: list[int]  # the input's row numbers

    @classmethod
    def of(cls, window: Window, padded: int) -> WindowCost:
        real = window.real
        return cls(int(real.sum()), padded, Counter(real.tolist()), [window.first + i for i in window.truncated])


@dataclass
class Tally:
    """The shard's running totals after each written window. Committed with the window
    (`shardinfer.shard.resume`), so a resumed shard's stats cover all its rows, kept ones included."""

    rows: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    truncated_rows: list[int] = field(default_factory=list)
    lengths: Counter = field(default_factory=Counter)  # rows per real token length, for the report's histogram
    row_errors: dict = field(default_factory=dict)  # RowErrors.stats() after the window (row_errors: record)
    task: dict = field(default_factory=dict)  # Task.finish() after the window

    def add(self, rows: int, cost: WindowCost, row_errors: dict, task: dict) -> None:
        self.rows += rows
        self.real_tokens += cost.real_tokens
        self.padded_tokens += cost.padded_tokens
        self.lengths.update(cost.lengths)
        self.truncated += len(cost.truncated)
        self.truncated_rows = sorted([*self.truncated_rows, *cost.truncated])[:FIRST_ROWS]  # windows run sorted
        self.row_errors, self.task = row_errors, task

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "lengths": {str(n): k for n, k in sorted(self.lengths.items())}}

    @classmethod
    def from_json(cls, data: dict) -> Tally:
        return cls(**{**data, "lengths": Counter({int(n): k for n, k in data["lengths"].items()})})

    def stats(self, seconds: float, runtime: Runtime, kept: Tally) -> dict:
        """The shard's stats: totals over all its rows, and `resumed_*` what the kept windows
        brought (this job's own work is the difference, what rates divide by:
        `contract.shard_file.computed`)."""
        resumed = {f"resumed_{name}": value for name, value in kept.task.items() if isinstance(value, int)}
        return {"rows": self.rows, "seconds": round(seconds, 3), "device": runtime.where, "dtype": runtime.dtype,
                **running_totals(kept.task, runtime.task.finish()),
                "resumed_rows": kept.rows, "resumed_real_tokens": kept.real_tokens, **resumed,
                "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens,
                "padding_ratio": round(self.padded_tokens / max(self.real_tokens, 1), 4),
                "truncated": self.truncated, "first_truncated_rows": self.truncated_rows,
                "token_lengths": {str(n): self.lengths[n] for n in sorted(self.lengths)}, **self.row_errors}


def running_totals(kept: dict, now: dict) -> dict:
    """A task's stats (`Task.finish`) over a resumed shard's jobs: its running totals (ints, e.g.
    generated tokens) summed with the kept windows'; its other values describe this job."""
    return {name: value + kept[name] if isinstance(value, int) and isinstance(kept.get(name), int) else value
            for name, value in now.items()}


def keep_schema_of(settings: Settings, plan: Plan, shard: int) -> pa.Schema:
    """The keep columns' types, read from the input's own schema: the fields after the task's
    columns (by position, as the text column may be kept too and then appears twice). Read at the
    shard's first rows (an empty shard: the first shard's with rows; an input without rows: the
    types its first part names, `Plan.no_rows`), so JSONL types come from the plan, not from another
    pass over the file; every part has the same types (`shardinfer.input.parts`)."""
    with_rows = shard if plan.pieces[shard] else next((k for k, pieces in enumerate(plan.pieces) if pieces), None)
    if with_rows is None:
        first = plan.no_rows(settings.input)
    else:
        _, first = next(plan.shard_rows(settings.input, with_rows))
    return pa.schema(list(first.schema)[len(settings.input.task_columns):])


@dataclass
class Runtime:
    task: Task
    device: torch.device
    where: str
    dtype: str
    batch: BatchSettings  # batch.max_tokens resolved for this device (`auto`)


def start_runtime(job: ShardJob, lease: Lease) -> Runtime:
    """Pick device and precision, then load the task (its model, tokenizer or the user's code)."""
    settings = job.settings
    device = choose_device(job.threads)
    dtype = choose_dtype(settings.model.dtype, device)
    if device.type == "cuda":
        where = f"cuda (CUDA_VISIBLE_DEVICES={lease.visible}, {torch.cuda.get_device_name(device)})"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    log.info("running on %s in %s", where, dtype)
    loaded_at = time.perf_counter()
    task = engine_class(settings).load(LoadContext(settings, device, dtype, job.tokens))
    what = settings.model.path or settings.model.entrypoint
    adapter = f" + adapter {settings.model.adapter}" if settings.model.adapter else ""
    log.info("loaded %s%s (task %s) in %.1f s", what, adapter, settings.model.task, time.perf_counter() - loaded_at)
    budget = batch_budget(settings.batch.max_tokens, device.type == "cuda", torch.get_num_threads(), task.one_pass)
    if not task.own_batches:
        log.info("batches of at most %d padded tokens (batch.max_tokens: %s) and %d rows", budget,
                 settings.batch.max_tokens, settings.batch.max_rows)
    batch = dataclasses.replace(settings.batch, max_tokens=budget)
    return Runtime(task, device, where, str(dtype).replace("torch.", ""), batch)


def first_window(sort_window: int) -> int:
    """A short first window: the device starts after 1/16 of a window is tokenized, not all of it."""
    return max(1, sort_window // 16)


def read_windows(job: ShardJob, plan: Plan, from_row: int) -> Iterator[tuple[int, pa.Table]]:
    size = job.settings.batch.sort_window
    return windows(plan.shard_rows(job.settings.input, job.shard, from_row), size, first_window(size))


def split_columns(item: tuple[int, pa.Table], task_columns: int) -> tuple[int, pa.Table, pa.Table]:
    """(first row, the task's columns, the keep columns), split by position: a kept text column
    has the same name as the text column. Both keep the window's row count, columns or not."""
    first, table = item
    return first, table.select(list(range(task_columns))), table.select(list(range(task_columns, table.num_columns)))


def shard_identity(job: ShardJob, plan: Plan, outputs: dict[str, str]) -> dict:
    """What the shard file says it is: plan, range, settings digest, task, and where its files are."""
    start, end = plan.ranges[job.shard]
    identity = {"plan_id": plan.plan_id, "shard": job.shard, "start": start, "end": end,
                "digest": job.digest, "task": job.settings.model.task}
    if job.files is not None:
        identity["files"] = {"folder": job.files, "columns": file_columns(outputs)}
    return identity


@dataclass
class Writer:
    """The write stage: a window's results as a table (its per-row files written first), committed
    as a window of its own (`shardinfer.shard.resume`) and written to the shard file, hashed as
    written so gather can check the values (`content`)."""

    writer: object  # pyarrow.parquet.ParquetWriter
    schema: pa.Schema
    task: Task
    files: ShardFiles | None
    windows: Path  # the shard's committed windows
    tally: Tally
    kept: Tally  # what the kept windows brought (a resumed shard)
    progress: Progress
    content: ContentHasher = field(default_factory=ContentHasher)
    record: bool = False  # row_errors: record (an `error` column last)

    def __call__(self, item: Written) -> None:
        table = self.table(item)
        self.tally.add(table.num_rows, item.cost, item.row_errors, running_totals(self.kept.task, item.task))
        if self.files is not None:
            self.files.sync()
        commit_window(self.windows, table, self.tally.to_json())
        self.writer.write_table(table)
        self.content.update(table)
        self.progress.advance(table.num_rows)

    def table(self, item: Written) -> pa.Table:
        keep, failed = item.keep, item.failed
        index = np.arange(item.first, item.first + keep.num_rows, dtype=np.int64)
        ok = np.ones(keep.num_rows, dtype=bool)
        ok[list(failed)] = False
        if not ok.any():  # every row of the window failed (row_errors: record)
            arrays = [pa.nulls(keep.num_rows, self.schema.field(name).type) for name in self.task.outputs]
        else:
            arrays = self.outputs(item.results, index[ok])
            arrays = [with_nulls(array, ok) for array in arrays] if failed else arrays
        if self.record:  # row_errors: record: the `error` column
            arrays.append(pa.array([failed.get(k) for k in range(keep.num_rows)], pa.string()))
        return pa.Table.from_arrays([pa.array(index), *keep.columns, *arrays], schema=self.schema)

    def outputs(self, results: dict, index: np.ndarray) -> list:
        """The task's columns for the rows in `index` (those with results), file columns written."""
        arrays = self.task.to_arrow(results, index)
        for position, name in enumerate(self.task.outputs):
            if name in (self.files.suffixes if self.files else {}):
                values = arrays[position]
                values = values.to_pylist() if isinstance(values, pa.Array) else list(values)
                arrays[position] = self.files.write(name, values, index)
        return arrays


@dataclass(frozen=True)
class Written:
    """What the device loop hands the writer for one window: not the window's inputs."""

    first: int
    keep: pa.Table
    results: dict
    failed: dict[int, str]
    cost: WindowCost
    row_errors: dict  # RowErrors.stats() after this window
    task: dict  # Task.finish() after this window


def with_nulls(values, ok: np.ndarray) -> pa.Array:
    """A column of the rows that succeeded, spread over all the window's rows: null where `ok` is not."""
    values = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    take = pa.array(np.cumsum(ok) - 1, mask=~ok)
    return values.take(take)


def shard_layout(job: ShardJob, plan: Plan, outputs: dict[str, str]) -> tuple[pa.Schema, dict[str, str]]:
    """The shard file's schema (with its identity) and its file columns' extensions; file columns
    need the job's files folder."""
    suffixes = file_columns(outputs)
    if suffixes and job.files is None:
        raise UserError(f"task `{job.settings.model.task}` declares file column(s) {sorted(suffixes)} but shard "
                        f"{job.shard}'s job has no files folder (ShardJob.files) to write them to")
    keep = keep_schema_of(job.settings, plan, job.shard)
    if job.settings.row_errors.record and ERROR_COLUMN in [*outputs, *keep.names]:
        raise UserError(f"a column `{ERROR_COLUMN}` (an output of task `{job.settings.model.task}` or a keep column) "
                        "clashes with the one row_errors.mode: record adds; rename it")
    schema = shard_schema(outputs, keep, shard_identity(job, plan, outputs), job.settings.row_errors.record)
    return schema, suffixes


def write_shard(job: ShardJob, plan: Plan, runtime: Runtime, began: float) -> dict:
    """Stream the shard's rows through the task into its file; returns the shard's stats.

    read → prepare (tokenize, or read token ids) → batch and build inputs run in workers, the
    device loop in this thread, and writing in another worker; each hands on through a bounded
    queue. Each window is committed as it is written, and a rerun goes on after the windows a
    stopped job committed (`shardinfer.shard.resume`). The stats carry each stage's busy seconds
    and the job's wall-clock span (from `began`, the epoch time the job started, to the file
    complete), so gather can time the run end to end.
    """
    settings, task = job.settings, runtime.task
    start, end = plan.ranges[job.shard]
    schema, suffixes = shard_layout(job, plan, task.outputs)
    started, columns, folder = time.perf_counter(), len(settings.input.task_columns), windows_folder(job.output)
    errors = RowErrors(job.shard, settings.row_errors.cap(end - start)) if settings.row_errors.record else None

    def prepare(item):
        first, task_part, keep = split_columns(item, columns)
        return task.prepare(first, task_part), keep

    def batch(item):
        prepared = prepare_batches(task, *item, runtime.batch)
        planned = [positions for positions, _ in prepared.batches]
        return prepared, WindowCost.of(prepared.window, task.padded_tokens(prepared.window, planned))

    # Commit order: the table is closed, then the files folder takes its name, then the table.
    with staged_files(job.files, suffixes) as files:
        kept = keep_committed(folder, shard_identity(job, plan, task.outputs), start, files)
        resumed = Tally.from_json(kept.tally) if kept.tally else Tally()
        if kept.paths:
            log.info("resumed at row %d (%d rows kept)", kept.next_row, kept.rows)
        if errors is not None and resumed.row_errors:
            errors.resume(resumed.row_errors)
        with (atomic_parquet_writer(job.output, schema, files and files.commit) as writer,
              torch.inference_mode(), Pipeline() as pipeline):
            write = Writer(writer, schema, task, files, folder, Tally.from_json(resumed.to_json()), resumed,
                           Progress(end - kept.next_row), assemble(kept.paths, writer), errors is not None)
            prepared = pipeline.map("batch", batch, pipeline.map(task.prepare_stage, prepare, pipeline.source(
                "read", read_windows(job, plan, kept.next_row))))
            output = pipeline.sink("write", write)
            try:
                for window, cost in pipeline.drain("device", prepared):
                    results = predict_window(task, window, runtime.device, errors)
                    failed = errors.take_window() if errors is not None else {}
                    pipeline.put(output, Written(window.window.first, window.keep, results, failed, cost,
                                                 errors.stats() if errors is not None else {}, task.finish()))
            except Terminated:  # commit the windows already predicted; the one on the device is lost
                pipeline.finish_sink(output)
                raise
            pipeline.finish(output)
            log.info("%s", pipeline.report())
            stats = write.tally.stats(time.perf_counter() - started, runtime, resumed)
            stats.update(bound_by=pipeline.bottleneck().name, stages=pipeline.busy_seconds(), started=round(began, 3),
                         ended=round(time.time(), 3))
            writer.add_key_value_metadata({STATS_KEY: json.dumps(stats), **write.content.metadata()})
    remove_windows(folder)
    return stats


def write_empty_shard(job: ShardJob, plan: Plan, began: float) -> dict:
    """A shard with no rows (more shards than rows): its file (and files folder) without loading the
    model or taking a device. Its columns are the task's declared ones (none yet for custom code,
    which gather allows for an empty shard)."""
    schema, _ = shard_layout(job, plan, dict(task_class(job.settings.model.task).outputs))
    stats = {"rows": 0, "seconds": 0.0, "device": "none (empty shard)", "dtype": None, "real_tokens": 0,
             "padded_tokens": 0, "truncated": 0, "first_truncated_rows": [], "token_lengths": {},
             "started": round(began, 3), "ended": round(time.time(), 3)}
    with staged_files(job.files, {}) as files, atomic_parquet_writer(job.output, schema, files and files.commit) as writer:
        writer.add_key_value_metadata({STATS_KEY: json.dumps(stats), **ContentHasher().metadata()})
    log.info("shard %d has no rows (more shards than rows): wrote an empty shard without loading the model", job.shard)
    return stats


def run_shard(job: ShardJob) -> dict:
    """The infer rule: the shard's rows through the task into `job.output`, atomically. SIGTERM
    stops it cleanly: what is committed stays for the rerun (`shardinfer.shard.stop`)."""
    hide_sklearn_from_transformers()
    try:
        with stop_on_sigterm():
            return compute_shard(job)
    except Terminated:
        row = leave_for_rerun(job)
        raise UserError(f"shard {job.shard}: stopped by SIGTERM at row {row}; rerun resumes there") from None
    except Exception:
        leave_for_rerun(job)
        raise


def leave_for_rerun(job: ShardJob) -> int | None:
    """The row a rerun of the failed or stopped job resumes at, logged when windows are kept (None:
    no plan to read it from); a job that committed nothing leaves nothing (`resume.left_for_rerun`)."""
    try:
        start = read_plan(job.plan_path).ranges[job.shard][0]
    except (OSError, UserError, ValueError, KeyError, IndexError):
        return None
    row = left_for_rerun(windows_folder(job.output), job.files and staging_folder(job.files), start)
    if row > start:
        log.info("the windows before row %d are committed: a rerun with the same plan and settings resumes there", row)
    return row


def compute_shard(job: ShardJob) -> dict:
    began = time.time()
    plan = read_plan(job.plan_path).for_shard(job.shard, job.cut)
    start, end = plan.ranges[job.shard]
    log.info("shard %d of %d: rows [%d, %d) of %s", job.shard, plan.shards, start, end, plan.input_path)
    if start == end:
        return write_empty_shard(job, plan, began)
    if job.tokens is not None:  # refuse token ids of another plan or tokenizer before loading anything
        check_token_file(job.tokens, token_identity(plan, job.shard, job.tokenizer_key))
    os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))  # the tokenizer's threads: this job's share
    lease = acquire_device(wait_s=default_wait_s())
    lease.export()
    try:
        stats = write_shard(job, plan, start_runtime(job, lease), began)
    finally:
        lease.release()
    if stats.get("row_errors"):
        log.warning("%d row(s) failed and are recorded in the `error` column (first rows: %s); %d extra predict "
                    "call(s) isolated them", stats["row_errors"], stats["first_row_errors"], stats["row_error_calls"])
    if stats["truncated"]:
        log.info("%d text(s) longer than max_length=%d were truncated (first rows: %s)",
                 stats["truncated"], job.settings.model.max_length, stats["first_truncated_rows"])
    rows = computed(stats, "rows")
    log.info("wrote %s: %d rows (%d computed in %.1f s, %.0f rows/s), padding ratio %.3f", job.output, stats["rows"],
             rows, stats["seconds"], rows / max(stats["seconds"], 1e-9), stats["padding_ratio"])
    return stats
