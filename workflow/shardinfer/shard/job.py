"""One shard: read its range → the task prepares rows → length-sorted batches → the device →
write atomically.

Every stage but the device loop runs in a background worker (`shardinfer.shard.pipeline`), so the
device does not wait on reading, tokenizing or building inputs when the CPU keeps up. The runner
knows no task or engine by name: it asks the engine (`shardinfer.engines.base`) to load the model
and the task, to batch and run the rows, and the task (`shardinfer.tasks.base`) to prepare them
and name its columns.

Reads top to bottom like a sampling script: the job's device and engine (`runtime`), the shard file's
columns and identity (`file_layout`), the windows through the pipeline to the writer (`writer`),
their stats (`stats`). The shard file carries the global row number in an `index` column and, in
its metadata, the plan and settings it was made under, so gather can prove it belongs
(`shardinfer.contract.shard_file`).
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Iterator

import pyarrow as pa
import torch

from shardinfer.contract.row_files import staging_folder
from shardinfer.contract.shard_file import computed
from shardinfer.core.errors import UserError
from shardinfer.engines.base import NOT_YET as NOT_READY
from shardinfer.hf.tokens import check_token_file, token_identity
from shardinfer.hf.transformers_import import hide_sklearn_from_transformers
from shardinfer.input.parts import windows
from shardinfer.plan.plan_file import Plan, read_plan
from shardinfer.shard.device_loop import Prepared, RowErrors, predict_window, prepare_batches
from shardinfer.shard.file_layout import shard_identity, shard_layout
from shardinfer.shard.pieces import shard_pieces
from shardinfer.shard.pipeline import NOT_YET, Pipeline
from shardinfer.shard.progress import Progress
from shardinfer.shard.resume import assemble, keep_committed, left_for_rerun, remove_windows, windows_folder
from shardinfer.shard.row_files import staged_files
from shardinfer.shard.runtime import Runtime, ShardJob, lease_devices, start_runtime
from shardinfer.shard.stats import Tally, WindowCost
from shardinfer.shard.stop import Terminated, stop_on_signals
from shardinfer.shard.writer import Writer, Written
from shardinfer.tasks import task_class

log = logging.getLogger(__name__)


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


def write_shard(job: ShardJob, plan: Plan, runtime: Runtime, began: float) -> dict:
    """Stream the shard's rows through the task into its file (`stream_windows`); returns the
    shard's stats. Each window is committed as it is written, and a rerun goes on after the windows a
    stopped job committed (`shardinfer.shard.resume`). The stats carry each stage's busy seconds
    and the job's wall-clock span (from `began`, the epoch time the job started, to the file
    complete), so gather can time the run end to end.
    """
    settings, task = job.settings, runtime.task
    start, end = plan.ranges[job.shard]
    schema, suffixes = shard_layout(job, plan, task.columns)
    started, folder = time.perf_counter(), windows_folder(job.output)
    errors = RowErrors(job.shard, settings.row_errors.cap(end - start)) if settings.row_errors.record else None
    # Commit order: the table is closed, then the files folder takes its name, then the table.
    identity = shard_identity(job, plan, task.columns)
    with staged_files(job.files, suffixes) as files:
        kept = keep_committed(folder, identity, start, files)
        resumed = Tally.from_json(kept.tally) if kept.tally else Tally()
        if kept.paths:
            log.info("resumed at row %d (%d rows kept)", kept.next_row, kept.rows)
        if errors is not None and resumed.row_errors:
            errors.resume(resumed.row_errors)
        with (shard_pieces(job.output, schema, start, job.part_bytes, files and files.commit, job.record,
                           identity) as pieces,
              torch.inference_mode(), Pipeline() as pipeline):
            assemble(kept.paths, pieces)
            write = Writer(pieces, schema, task, files, folder, Tally.from_json(resumed.to_json()), resumed,
                           Progress(end - kept.next_row), errors is not None)
            stream_windows(pipeline, job, plan, runtime, kept.next_row, write, errors)
            tally = write.tally
            work = tally.work_stats(resumed, runtime.engine.finish(), task.reporting.totals)
            stats = tally.stats(time.perf_counter() - started, runtime.where, runtime.dtype, **work,
                                bound_by=pipeline.bottleneck().name, stages=pipeline.busy_seconds(),
                                started=round(began, 3), ended=round(time.time(), 3))
            pieces.finish(stats)
    remove_windows(folder)
    return stats


def stream_windows(pipeline: Pipeline, job: ShardJob, plan: Plan, runtime: Runtime, from_row: int, write: Writer,
                   errors: RowErrors | None) -> None:
    """read → prepare (tokenize, or read token ids) → batch and build inputs run in workers, the
    device loop in this thread, and writing (`write`) in another worker; each hands on through a
    bounded queue. SIGTERM or SIGINT (`Terminated`) lets the writer commit the windows already predicted."""
    engine, task, columns = runtime.engine, runtime.task, len(job.settings.input.task_columns)

    def prepare(item):
        first, task_part, keep = split_columns(item, columns)
        return task.prepare(first, task_part), keep

    def batch(item):
        prepared = prepare_batches(engine, *item, runtime.batch)
        planned = [positions for positions, _ in prepared.batches]
        return prepared, WindowCost.of(prepared.window, engine.padded_tokens(prepared.window, planned))

    prepared = pipeline.map("batch", batch, pipeline.map(task.prepare_stage, prepare, pipeline.source(
        "read", read_windows(job, plan, from_row))))
    output = pipeline.sink("write", write)
    try:
        for window, cost, results, failed in device_results(pipeline, prepared, runtime, errors):
            pipeline.put(output, Written(window.window.first, window.keep, results, failed, cost,
                                         errors.stats() if errors is not None else {}, engine.finish()))
    except Terminated:  # commit the windows already predicted; those on the device are lost
        pipeline.finish_sink(output)
        raise
    pipeline.finish(output)
    log.info("%s", pipeline.report())


def device_results(pipeline: Pipeline, prepared: queue.Queue, runtime: Runtime, errors: RowErrors | None
                   ) -> Iterator[tuple[Prepared, WindowCost, dict, dict[int, str]]]:
    """Each window's results in order, with its failed rows (row_errors: record): one window at a
    time through the device loop, or, for an engine that `feeds`, all windows as one stream
    (`Engine.feed`) that takes the next window without waiting while the engine has work."""
    engine = runtime.engine
    if not engine.feeds:
        for window, cost in pipeline.drain("device", prepared):
            results = predict_window(engine, window, runtime.device, errors)
            yield window, cost, results, errors.take_window() if errors is not None else {}
        return
    feed = pipeline.feed("device", prepared)

    def take(wait: bool):
        item = feed.take(wait)
        if item is NOT_YET:
            return NOT_READY
        if item is None:
            return None
        (window, cost) = item
        return (window, cost), window.window, window.batches

    try:
        for (window, cost), results, failed in engine.feed(take, errors is not None):
            if errors is not None:
                for position, message in failed.items():
                    errors.record(window.window.first + position, position, message)
                failed = errors.take_window()
            yield window, cost, results, failed
    finally:
        feed.end()


def write_empty_shard(job: ShardJob, plan: Plan, began: float) -> dict:
    """A shard with no rows (more shards than rows): its file (and files folder) without loading the
    model or taking a device. Its columns are those the task's settings give (`Task.output_fields`;
    none yet for custom code, which gather allows for an empty shard)."""
    outputs = task_class(job.settings.model.task).output_fields(job.settings)
    schema, _ = shard_layout(job, plan, outputs)
    stats = Tally().stats(0.0, "none (empty shard)", None, started=round(began, 3), ended=round(time.time(), 3))
    start = plan.ranges[job.shard][0]
    with (staged_files(job.files, {}) as files,
          shard_pieces(job.output, schema, start, None, files and files.commit, job.record,
                       shard_identity(job, plan, outputs)) as pieces):
        pieces.finish(stats)
    log.info("shard %d has no rows (more shards than rows): wrote an empty shard without loading the model", job.shard)
    return stats


def run_shard(job: ShardJob) -> dict:
    """The infer rule: the shard's rows through the task into `job.output`, atomically. SIGTERM or
    SIGINT stops it cleanly: what is committed stays for the rerun (`shardinfer.shard.stop`)."""
    hide_sklearn_from_transformers()
    try:
        with stop_on_signals():
            return compute_shard(job)
    except Terminated as stopped:
        row = leave_for_rerun(job)
        raise UserError(f"shard {job.shard}: stopped by {stopped.name} at row {row}; rerun resumes there") from None
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
    if job.part_bytes:
        log.info("a new piece of the shard file once one holds %d bytes (output.part_size)", job.part_bytes)
    if start == end:
        return write_empty_shard(job, plan, began)
    if job.tokens is not None:  # refuse token ids of another plan or tokenizer before loading anything
        check_token_file(job.tokens, token_identity(plan, job.shard, job.tokenizer_key))
    os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))  # the tokenizer's threads: this job's share
    lease = lease_devices(job.settings)
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
