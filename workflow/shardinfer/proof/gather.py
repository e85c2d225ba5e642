"""Gather: prove the shard files add up to the input, row for row (`shardinfer.proof.prove`), then
hand the proven rows to the chosen writers (`output.writers`: `shardinfer.output`) and write the
summary (`shardinfer.proof.summary`). The job is one `GatherJob`, built where it starts
(workflow/scripts/gather.py).

Nothing is written until every check holds. The writers take the rows as they pass, row group by row
group, in one read (`shardinfer.output.write`), so memory does not grow with the table: a shard whose
files are no longer as its job left them has its values hashed as they pass and checked against the
digest its job recorded, and a mismatch (or a page failing its checksum) aborts every writer, none
of whose files takes its name. The Parquet table of the parts layout is the shards' own files,
hard-linked, with a manifest (`shardinfer.proof.publish`): gather reads metadata and index columns,
and the bytes or values of a changed shard only. A file that an earlier run's writers left and this
run's do not write (a writer switched off) is removed first: it is never presented as current.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shardinfer.contract.file_digest import file_digest
from shardinfer.contract.shard_file import IDENTITY_KEY
from shardinfer.core.atomic import write_json_atomic
from shardinfer.core.errors import ProofError, UserError
from shardinfer.core.jobs import withdraw
from shardinfer.output import TABLE, chosen_writers, stale_paths
from shardinfer.output.base import Destination, Proven, Writer
from shardinfer.output.write import write_all
from shardinfer.plan.plan_file import Plan, read_plan
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


@dataclass(frozen=True)
class GatherJob:
    """One gather job. `shard_paths`: the shard files in order (without a shared filesystem in the parts
    layout, the parts' names in the bucket); `model`: the model section of the rule's settings (task,
    path); `outputs`: the rule's outputs by name, `summary` and each writer's files
    (`shardinfer.output.writer_files`). `files_folders`: each shard's files folder when the task may
    write files; `local_parts`, `part_names`, `records`: see `prove` (with `records`, `copies` are the
    parts' downloaded copies, when `evaluate:` scores them)."""

    plan_path: str
    shard_paths: tuple[str, ...]
    inp: InputSettings
    model: Mapping
    digest: str
    outputs: Mapping[str, str]
    output: OutputSettings = field(default_factory=OutputSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    files_folders: tuple[str, ...] = ()
    local_parts: tuple[str, ...] | None = None
    part_names: tuple[str, ...] = ()
    records: tuple[str, ...] | None = None
    copies: tuple[str, ...] | None = None

    @property
    def summary(self) -> str:
        return self.outputs["summary"]

    @property
    def stored(self) -> bool:
        """Without a shared filesystem in the parts layout: the parts are the shard jobs', in the bucket."""
        return self.records is not None

    @property
    def writers(self) -> list[Writer]:
        return chosen_writers(self.output, self.inp, storage=self.stored)

    def where(self, writer: Writer) -> Destination:
        paths = {key: self.outputs[key] for key in writer.files(self.output.parts)}
        return Destination(paths, self.output.parts, self.output.part_bytes)


def run_gather(job: GatherJob) -> dict:
    """The gather rule: prove, then write the chosen writers' files and the summary (each atomically),
    the summary with the table's scores against `evaluate.label_column` when set. On a refusal no
    file of this job is left, and no folder of an earlier run as if it were current."""
    writers = job.writers
    remove_stale(job, writers)
    try:
        return prove_and_write(job, writers)
    except UserError:
        for writer in writers:
            withdraw_written(job, writer)
        raise


def remove_stale(job: GatherJob, writers: list[Writer]) -> None:
    """Remove what an earlier run's writers left beside this run's outputs and this run's do not write."""
    withdraw(stale_paths(writers, job.output.parts, str(Path(job.summary).parent)),
             "of an earlier run: output.writers and output.layout no longer write it")


def withdraw_written(job: GatherJob, writer: Writer) -> None:
    """A refused job's files of `writer`, and the folder that holds them where it has one (the Parquet
    parts'; never without a shared filesystem, where its parts are the shard jobs' own)."""
    paths = [job.outputs[key] for key in writer.files(job.output.parts)]
    if writer.folder(job.output.parts) and not job.stored:
        paths = [str(Path(paths[0]).parent)]
    withdraw(paths, "as gather stopped: no file of an earlier run is left as if it were current")


def prove_and_write(job: GatherJob, writers: list[Writer]) -> dict:
    """`run_gather`'s work, which it undoes on a refusal."""
    plan = read_plan(job.plan_path)
    refuse_no_columns(plan, job.model.get("task"))
    shards = prove(plan, list(job.shard_paths), job.inp, job.digest, list(job.files_folders) or None,
                   listed(job.local_parts), list(job.part_names), listed(job.records))
    if not plan.rows:
        log.warning("WARNING input `%s` has no rows: the table has its columns and no row", plan.input_path)
    log.info("proof holds: %d shards, %d rows, index 0..%d in order, input unchanged", plan.shards, plan.rows,
             plan.rows - 1)
    gold = job.evaluate.label_column
    if gold:  # a gold column it cannot score is refused before anything is written
        check_gold(next((s.schema for s in shards if s.rows), None), job.model["task"], gold)
    facts = write_all(writers, proven_rows(job, plan, shards), {w.name: job.where(w) for w in writers})
    report = summarize(plan, shards, job.inp, dict(job.model))
    report["output"], report["outputs"] = next(iter(facts.values())), facts
    if gold:
        report["metrics"] = score_predictions(scored_files(facts.get(TABLE), shards, job.copies), dict(job.model),
                                              gold)
        log.info("scored against `%s`: %s", gold, headline(report["metrics"]))
    write_json_atomic(job.summary, report)
    for name, written in facts.items():
        log.info("%s wrote %s (%d part(s), %d bytes)", name, written["path"], written["parts"], written["bytes"])
    log.info("wrote %s; every shard's values match the digest its job recorded", job.summary)
    return report


def listed(paths: tuple[str, ...] | None) -> list[str] | None:
    return None if paths is None else list(paths)


def proven_rows(job: GatherJob, plan: Plan, shards: list[ShardFile]) -> Proven:
    """The proven rows as the writers take them: the shards' row groups in index order, read ahead
    in a thread of their own, a changed shard's values checked as they pass; the schema with the
    table's identity; the parts layout's placing of the shards' own files."""
    metadata = {IDENTITY_KEY: json.dumps({"plan_id": plan.plan_id, "digest": job.digest, "rows": plan.rows}).encode()}
    # An input without rows: the empty shards' columns, the task's declared ones (`refuse_no_columns`).
    # Without a shared filesystem, in the parts layout, the shards are known by their records alone
    # (no schema read): the parts stay where their jobs wrote them (`place_parts`).
    first = next((s for s in shards if s.rows), shards[0])
    schema = first.schema.with_metadata(metadata) if first.schema is not None else None
    tables = read_ahead(table for shard in shards
                        for table in verified_row_groups(shard, check_values=not shard.unchanged))
    return Proven(tables, schema, plan, job.digest, job.model.get("path") or "",
                  functools.partial(place_parts, job, plan, shards))


def place_parts(job: GatherJob, plan: Plan, shards: list[ShardFile], folder: str) -> dict:
    """The parts layout's folder: on a shared filesystem the shards' files linked into it
    (`publish`); without one (`job.stored`) the manifest of the parts the shard jobs wrote."""
    if not job.stored:
        return publish(shards, plan, job.digest, folder)
    names = [Path(name).name for name in job.shard_paths]
    content = parts_in_place(shards, names, plan, job.digest, str(Path(folder) / MANIFEST_NAME))
    too_large = [part["name"] for part in content["parts"] if part["bytes"] > job.output.part_bytes]
    if too_large:
        log.warning("WARNING %d part(s) are larger than output.part_size (%s), first %s: without a shared filesystem "
                    "each shard is one part; give more shards for smaller parts", len(too_large),
                    job.output.part_size, too_large[0])
    return output_facts(folder, content)


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


def scored_files(facts: dict | None, shards: list[ShardFile], copies: tuple[str, ...] | None = None
                 ) -> str | list[str]:
    """What `evaluate:` scores: the Parquet table (`facts`: what its writer wrote, None: not written),
    or the shards' files in index order, proven by then (without a shared filesystem the parts'
    downloaded copies, each refused unless its bytes are those its job recorded)."""
    if facts is not None and facts["layout"] == "file":
        return facts["path"]
    if copies is None:
        return [piece.path for shard in shards for piece in shard.files_in_order]
    for shard, copy in zip(shards, copies):
        if file_digest(copy) != shard.pieces[0].sha256:
            raise ProofError(f"shard {shard.shard} (`{shard.path}`): the part in the bucket is not the file its job "
                             "recorded (SHA-256 differs); delete it and rerun its infer job")
    return list(copies)
