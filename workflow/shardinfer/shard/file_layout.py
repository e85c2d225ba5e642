"""The shard file's layout, fixed before its first row is written: its columns (index, the keep
columns in the input's own types, the task's outputs, `error` with row_errors: record) and the
identity in its metadata (plan, range, settings digest, task, where its files are), by the
contract gather proves it against (`shardinfer.contract.shard_file`).
"""

from __future__ import annotations

import pyarrow as pa

from shardinfer.contract.shard_file import ERROR_COLUMN, OutputType, file_columns, shard_schema
from shardinfer.core.errors import UserError
from shardinfer.plan.plan_file import Plan
from shardinfer.settings.config import Settings
from shardinfer.shard.runtime import ShardJob


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


def shard_identity(job: ShardJob, plan: Plan, outputs: dict[str, OutputType]) -> dict:
    """What the shard file says it is: plan, range, settings digest, task, and where its files are."""
    start, end = plan.ranges[job.shard]
    identity = {"plan_id": plan.plan_id, "shard": job.shard, "start": start, "end": end,
                "digest": job.digest, "task": job.settings.model.task}
    if job.files is not None:
        identity["files"] = {"folder": job.files, "columns": file_columns(outputs)}
    return identity


def shard_layout(job: ShardJob, plan: Plan, outputs: dict[str, OutputType]) -> tuple[pa.Schema, dict[str, str]]:
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
