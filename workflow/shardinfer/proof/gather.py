"""Gather: prove the shard files add up to the input, row for row (`shardinfer.proof.prove`), then
publish them and write the summary (`shardinfer.proof.summary`).

Nothing is written until every check holds. Two layouts (`output.layout`):

- `file`: one table, streamed row group by row group, so memory does not grow with the table. A
  shard whose files are no longer as its job left them has its values hashed as they pass and
  checked against the digest its job recorded; a mismatch (or a page failing its checksum) aborts the
  write, leaving no predictions file.
- `parts`: a folder of the shards' own files, hard-linked, with a manifest (`shardinfer.proof.publish`);
  gather reads metadata and index columns, and the bytes or values of a changed shard only.
"""

from __future__ import annotations

import json
import logging
import shutil
from contextlib import ExitStack
from pathlib import Path

from shardinfer.contract.file_digest import file_digest
from shardinfer.contract.shard_file import IDENTITY_KEY, dictionary_columns
from shardinfer.core.atomic import atomic_parquet_writer, atomic_path, write_json_atomic
from shardinfer.core.errors import ProofError, UserError
from shardinfer.plan.plan_file import Plan, read_plan
from shardinfer.proof.batch_output import output_lines, request_key
from shardinfer.proof.manifest import MANIFEST_NAME
from shardinfer.proof.prove import prove
from shardinfer.proof.publish import parts_in_place, publish_parts
from shardinfer.proof.shards import ShardFile
from shardinfer.proof.summary import summarize
from shardinfer.proof.values import (
    prove_row_files,
    prove_values,
    read_ahead,
    values_checked,
    verified_row_groups,
    with_bytes_unknown,
)
from shardinfer.scores.metrics import check_gold, headline, score_predictions
from shardinfer.settings.config import EvaluateSettings, InputSettings, OutputSettings
from shardinfer.tasks import TASKS, task_class

log = logging.getLogger(__name__)


def write_predictions(shards: list[ShardFile], plan: Plan, digest: str, path: str,
                      batch_output: tuple[str, str] | None = None) -> dict:
    """Concatenate proven shards in index order, one row group at a time, and with `batch_output`
    ((its path, the model's path)) write the OpenAI batch output file from the same row groups. A
    changed shard whose values or pages fail their check raises inside the atomic writes: neither
    file takes its final name."""
    metadata = {IDENTITY_KEY: json.dumps({"plan_id": plan.plan_id, "digest": digest, "rows": plan.rows}).encode()}
    # An input without rows: the empty shards' columns, the task's declared ones (`refuse_no_columns`).
    schema = next((s for s in shards if s.rows), shards[0]).schema.with_metadata(metadata)
    with ExitStack() as files:
        lines = None
        if batch_output is not None:
            lines = files.enter_context(open(files.enter_context(atomic_path(batch_output[0])), "w", encoding="utf-8"))
        writer = files.enter_context(atomic_parquet_writer(path, schema, use_dictionary=dictionary_columns(schema)))
        for table in read_ahead(table for shard in shards
                                for table in verified_row_groups(shard, check_values=not shard.unchanged)):
            writer.write_table(table.replace_schema_metadata(metadata))
            if lines is not None:
                lines.writelines(output_lines(table, request_key(plan, digest), batch_output[1]))
    return {"layout": "file", "path": path, "parts": 1, "bytes": Path(path).stat().st_size}


def publish(shards: list[ShardFile], plan: Plan, digest: str, folder: str) -> dict:
    """The parts layout on a shared filesystem: the values of the shards that changed since their job
    wrote them are checked first (their bytes, then where those differ their values), then the folder
    is made of the shards' files."""
    changed = {shard.shard for shard in values_checked(shards)}
    for shard in shards:
        if shard.shard in changed:
            prove_values(shard)
        else:
            prove_row_files(shard)
    shards = [with_bytes_unknown(s) if s.shard in changed else s for s in shards]
    content = publish_parts(shards, plan, digest, folder)
    return output_facts(folder, content)


def output_facts(folder: str, content: dict) -> dict:
    return {"layout": "parts", "path": f"{folder.rstrip('/')}/", "parts": len(content["parts"]),
            "bytes": content["bytes"], "manifest": MANIFEST_NAME}


def refuse_no_columns(plan: Plan, task: str | None) -> None:
    """An input without rows gives a table of the columns its settings give (`Task.output_fields`,
    the empty shards'); a task whose columns are known only once its code loads in a shard job with
    rows (custom) has none."""
    if plan.rows == 0 and task in TASKS and task_class(task).columns_from_code:
        raise UserError(f"input `{plan.input_path}` has no rows, and task {task} names its output columns only "
                        "when its code loads for rows: there is no table to write")


def write_output(shards: list[ShardFile], plan: Plan, digest: str, predictions: str, output: OutputSettings,
                 stored_parts: list[str] | None, batch_output: tuple[str, str] | None = None) -> dict:
    """The table as the layout says: one file, the folder of parts, or without a shared filesystem
    (`stored_parts`: the parts' names in the bucket) the manifest of the parts the shard jobs wrote."""
    if not output.parts:
        return write_predictions(shards, plan, digest, predictions, batch_output)
    if stored_parts is None:
        return publish(shards, plan, digest, predictions)
    manifest = str(Path(predictions) / MANIFEST_NAME)
    content = parts_in_place(shards, [Path(name).name for name in stored_parts], plan, digest, manifest)
    too_large = [part["name"] for part in content["parts"] if part["bytes"] > output.part_bytes]
    if too_large:
        log.warning("WARNING %d part(s) are larger than output.part_size (%s), first %s: without a shared filesystem "
                    "each shard is one part; give more shards for smaller parts", len(too_large), output.part_size,
                    too_large[0])
    return output_facts(predictions, content)


def run_gather(plan_path: str, shard_paths: list[str], inp: InputSettings, model: dict, digest: str,
               predictions: str, summary: str, files_folders: list[str] | None = None,
               evaluate: EvaluateSettings | None = None, local_parts: list[str] | None = None,
               part_names: list[str] | None = None, output: OutputSettings | None = None,
               records: list[str] | None = None, copies: list[str] | None = None,
               batch_output: str | None = None) -> dict:
    """The gather rule: prove, then write the table (`output.layout`: a file at `predictions`, or the
    folder of parts `predictions`) and the summary (both atomically), the summary with the table's
    scores against `evaluate.label_column` when set. `files_folders`: each shard's files folder
    (results/files/<shard>) when the task may write files; `local_parts`, `part_names`, `records`: see
    `prove` (with `records`, `shard_paths` are the parts' names in the bucket, and `copies` their
    downloaded copies when `evaluate:` scores them); `batch_output`: the OpenAI batch output file's
    path, for an input of that format."""
    output = output or OutputSettings()
    try:
        return prove_and_write(plan_path, shard_paths, inp, model, digest, predictions, summary, files_folders,
                               evaluate, local_parts, part_names, output, records, copies, batch_output)
    except UserError:
        if output.parts and records is None:  # no folder of an earlier run is left as if it were current
            shutil.rmtree(predictions, ignore_errors=True)
        raise


def prove_and_write(plan_path: str, shard_paths: list[str], inp: InputSettings, model: dict, digest: str,
                    predictions: str, summary: str, files_folders: list[str] | None, evaluate: EvaluateSettings | None,
                    local_parts: list[str] | None, part_names: list[str] | None, output: OutputSettings,
                    records: list[str] | None, copies: list[str] | None, batch_output: str | None = None) -> dict:
    """`run_gather`'s work, which it undoes on a refusal."""
    plan = read_plan(plan_path)
    refuse_no_columns(plan, model.get("task"))
    shards = prove(plan, shard_paths, inp, digest, files_folders, local_parts, part_names, records)
    if not plan.rows:
        log.warning("WARNING input `%s` has no rows: the table has its columns and no row", plan.input_path)
    log.info("proof holds: %d shards, %d rows, index 0..%d in order, input unchanged", plan.shards, plan.rows,
             plan.rows - 1)
    gold = evaluate.label_column if evaluate else None
    if gold:  # a gold column it cannot score is refused before anything is written
        check_gold(next((s.schema for s in shards if s.rows), None), model["task"], gold)
    batch = batch_output and (batch_output, model.get("path") or "")
    facts = write_output(shards, plan, digest, predictions, output, shard_paths if records is not None else None,
                         batch)
    report = summarize(plan, shards, inp, model)
    report["output"] = facts
    if gold:
        report["metrics"] = score_predictions(scored_files(facts, shards, copies), model, gold)
        log.info("scored against `%s`: %s", gold, headline(report["metrics"]))
    write_json_atomic(summary, report)
    if batch_output:
        log.info("wrote %s: one line per request, in input order", batch_output)
    log.info("wrote %s (%d part(s), %d bytes) and %s; every shard's values match the digest its job recorded",
             facts["path"], facts["parts"], facts["bytes"], summary)
    return report


def scored_files(facts: dict, shards: list[ShardFile], copies: list[str] | None = None) -> str | list[str]:
    """What `evaluate:` scores: the table, or the parts' files in index order (without a shared
    filesystem their downloaded copies, each refused unless its bytes are those its job recorded)."""
    if facts["layout"] == "file":
        return facts["path"]
    if copies is None:
        return [piece.path for shard in shards for piece in shard.files_in_order]
    for shard, copy in zip(shards, copies):
        if file_digest(copy) != shard.pieces[0].sha256:
            raise ProofError(f"shard {shard.shard} (`{shard.path}`): the part in the bucket is not the file its job "
                             "recorded (SHA-256 differs); delete it and rerun its infer job")
    return list(copies)
