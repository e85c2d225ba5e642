"""Gather: prove the shard files add up to the input, row for row (`shardinfer.proof.prove`), then
concatenate them and write the summary (`shardinfer.proof.summary`).

Nothing is written until every check holds. The output is then streamed row group by row group,
so memory does not grow with the table, and each shard's values are hashed as they pass and
checked against the digest its job recorded; a mismatch (or a page failing its checksum) aborts
the write, leaving no predictions file.
"""

from __future__ import annotations

import json
import logging

from shardinfer.atomic import atomic_parquet_writer, write_json_atomic
from shardinfer.config import EvaluateSettings, InputSettings
from shardinfer.contract.shard_file import IDENTITY_KEY
from shardinfer.errors import UserError
from shardinfer.metrics import check_gold, headline, score_predictions
from shardinfer.plan import Plan, read_plan
from shardinfer.proof.prove import ShardFile, prove, verified_row_groups
from shardinfer.proof.summary import summarize
from shardinfer.tasks import TASKS, task_class

log = logging.getLogger(__name__)


def write_predictions(shards: list[ShardFile], plan: Plan, digest: str, path: str) -> None:
    """Concatenate proven shards in index order, one row group at a time. A shard whose values or
    pages fail their check raises inside the atomic write: nothing takes the final name."""
    metadata = {IDENTITY_KEY: json.dumps({"plan_id": plan.plan_id, "digest": digest, "rows": plan.rows}).encode()}
    # An input without rows: the empty shards' columns, the task's declared ones (`refuse_no_columns`).
    schema = next((s for s in shards if s.rows), shards[0]).schema.with_metadata(metadata)
    with atomic_parquet_writer(path, schema) as writer:
        for shard in shards:
            for table in verified_row_groups(shard):
                writer.write_table(table.replace_schema_metadata(metadata))


def refuse_no_columns(plan: Plan, task: str | None) -> None:
    """An input without rows gives a table of the columns its settings give (`Task.output_fields`,
    the empty shards'); a task whose columns are known only once its code loads in a shard job with
    rows (custom) has none."""
    if plan.rows == 0 and task in TASKS and task_class(task).columns_from_code:
        raise UserError(f"input `{plan.input_path}` has no rows, and task {task} names its output columns only "
                        "when its code loads for rows: there is no table to write")


def run_gather(plan_path: str, shard_paths: list[str], inp: InputSettings, model: dict, digest: str,
               predictions: str, summary: str, files_folders: list[str] | None = None,
               evaluate: EvaluateSettings | None = None, local_parts: list[str] | None = None,
               part_names: list[str] | None = None) -> dict:
    """The gather rule: prove, then write predictions and summary (both atomically), the summary with
    the table's scores against `evaluate.label_column` when set. `files_folders`: each shard's files
    folder (results/files/<shard>) when the task may write files; `local_parts`, `part_names`: see `prove`."""
    plan = read_plan(plan_path)
    refuse_no_columns(plan, model.get("task"))
    shards = prove(plan, shard_paths, inp, digest, files_folders, local_parts, part_names)
    if not plan.rows:
        log.warning("WARNING input `%s` has no rows: the table has its columns and no row", plan.input_path)
    log.info("proof holds: %d shards, %d rows, index 0..%d in order, input unchanged", plan.shards, plan.rows,
             plan.rows - 1)
    gold = evaluate.label_column if evaluate else None
    if gold:  # a gold column it cannot score is refused before anything is written
        check_gold(next((s.schema for s in shards if s.rows), None), model["task"], gold)
    write_predictions(shards, plan, digest, predictions)
    report = summarize(plan, shards, inp, model)
    if gold:
        report["metrics"] = score_predictions(predictions, model, gold)
        log.info("scored against `%s`: %s", gold, headline(report["metrics"]))
    write_json_atomic(summary, report)
    log.info("wrote %s and %s; every shard's values match the digest its job recorded", predictions, summary)
    return report
