"""Gather: prove the shard files add up to the input, row for row, then concatenate them.

The plan says what must exist. Nothing is written until every check holds: the input is
unchanged (the same parts, each of the planned size, mtime, content digest and rows), each planned shard file belongs
to this plan and these settings, and its `index` column is exactly its planned range, in order.
The output is then streamed row group by row group, so memory does not grow with the table, and
each shard's values are hashed as they pass and checked against the digest its job recorded; a
mismatch (or a page failing its checksum) aborts the write, leaving no predictions file.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.atomic import atomic_parquet_writer, write_json_atomic
from shardinfer.config import EvaluateSettings, InputSettings
from shardinfer.metrics import check_gold, headline, score_predictions
from shardinfer.contract.content_digest import CONTENT_KEY, ContentHasher
from shardinfer.errors import ProofError, UserError
from shardinfer.contract.row_files import prove_files, refuse_unlisted, staging_folder
from shardinfer.input.identity import digest_alongside
from shardinfer.input.parts import Part, one_file, refuse_other_parts
from shardinfer.plan import Plan, read_plan
from shardinfer.contract.shard_file import FILE_TYPE, IDENTITY_KEY, INDEX_COLUMN, STATS_KEY, computed
from shardinfer.input.scan import count_rows
from shardinfer.tasks import TASKS, task_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardFile:
    shard: int
    path: str
    rows: int
    schema: pa.Schema
    stats: dict
    content: str  # the digest of its values its job recorded (shardinfer.contract.content_digest)
    files: dict | None = None  # {"folder", "columns": {column: suffix}} when the task may write files


def describe_index_fault(index: np.ndarray, start: int, end: int) -> str:
    """Say what is wrong with an index column that should be exactly start..end-1 in order."""
    expected = np.arange(start, end, dtype=np.int64)
    values, counts = np.unique(index, return_counts=True)
    if (counts > 1).any():
        return f"index {int(values[counts > 1][0])} appears {int(counts[counts > 1][0])} times"
    missing = np.setdiff1d(expected, values)
    if missing.size:
        return f"row {int(missing[0])} is missing ({missing.size} missing, planned [{start}, {end}))"
    extra = np.setdiff1d(values, expected)
    if extra.size:
        return f"row {int(extra[0])} is outside its planned range [{start}, {end})"
    first = int(np.flatnonzero(index != expected)[0])
    return f"rows out of order at position {first} (index {int(index[first])}, expected {start + first})"


def _metadata(file: pq.ParquetFile, key: bytes) -> dict | None:
    raw = (file.metadata.metadata or {}).get(key)
    return json.loads(raw) if raw else None


def open_verified(path: str) -> pq.ParquetFile:
    """A Parquet file whose pages are checked against their CRC32 as they are read (written by
    `atomic_parquet_writer`): bit rot on disk is an error, not wrong values."""
    return pq.ParquetFile(path, page_checksum_verification=True)


def read_fault(error: Exception) -> str:
    """What a failed read means, in a few words: a page failing its checksum, or anything else."""
    first = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
    if "checksum" in first.lower():
        return f"damaged: a page fails its checksum ({first})"
    return f"unreadable or truncated parquet ({first})"


def prove_shard(plan: Plan, shard: int, path: str, digest: str, folder: str | None = None) -> ShardFile:
    """Check one shard file against its planned range (and its files against `folder`, the shard's
    expected files folder when the task may write files); raise ProofError naming the fault."""
    start, end = plan.ranges[shard]
    where = f"shard {shard} (`{path}`)"
    if not Path(path).is_file():
        raise ProofError(f"{where}: file is missing; rerun its infer job")
    try:
        file = open_verified(path)
        identity, stats = _metadata(file, IDENTITY_KEY), _metadata(file, STATS_KEY) or {}
        content = _metadata(file, CONTENT_KEY) or {}
        index = None
        if identity is not None and INDEX_COLUMN in file.schema_arrow.names:
            index = file.read(columns=[INDEX_COLUMN]).column(0)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ProofError(f"{where}: {read_fault(error)}") from error
    if identity is None or index is None:
        raise ProofError(f"{where}: not a shard file of this workflow (no shard identity or `{INDEX_COLUMN}` column)")
    if identity.get("plan_id") != plan.plan_id:
        raise ProofError(f"{where}: made under another plan ({identity.get('plan_id')}, current {plan.plan_id}); rerun it")
    if (identity.get("shard"), identity.get("start"), identity.get("end")) != (shard, start, end):
        raise ProofError(f"{where}: holds shard {identity.get('shard')} [{identity.get('start')}, {identity.get('end')}), planned [{start}, {end})")
    if identity.get("digest") != digest:
        raise ProofError(f"{where}: made with other model or output settings ({identity.get('digest')}, current {digest}); rerun it")
    if index.null_count:
        raise ProofError(f"{where}: {index.null_count} null value(s) in `{INDEX_COLUMN}`")
    values = index.to_numpy()
    if values.size != end - start or not np.array_equal(values, np.arange(start, end)):
        raise ProofError(f"{where}: {describe_index_fault(values, start, end)}")
    if not content.get("digest"):
        raise ProofError(f"{where}: its metadata holds no digest of its values, which its infer job always writes "
                         "(the file was rewritten by another tool, or its metadata edited); delete it and rerun its "
                         "infer job")
    schema = file.schema_arrow.remove_metadata()
    return ShardFile(shard=shard, path=path, rows=int(values.size), schema=schema, stats=stats,
                     content=content["digest"], files=files_identity(where, identity, schema, folder))


def files_identity(where: str, identity: dict, schema: pa.Schema, folder: str | None) -> dict | None:
    """The shard's files as gather will check them: in the folder the workflow expects (None: the
    task writes no files), with the file columns its schema has, not only those its metadata names."""
    files = identity.get("files")
    in_schema = sorted(f.name for f in schema if f.type.equals(FILE_TYPE))
    if folder is None:
        if files is not None or in_schema:
            raise ProofError(f"{where}: has files (columns {in_schema}) but this workflow's task writes none")
        return None
    if files is None:
        raise ProofError(f"{where}: names no files folder, expected `{folder}`; rerun it")
    if files.get("folder") != folder:
        raise ProofError(f"{where}: names files folder `{files.get('folder')}`, expected `{folder}`; rerun it")
    if sorted(files.get("columns") or {}) != in_schema:
        raise ProofError(f"{where}: its metadata names file columns {sorted(files.get('columns') or {})}, "
                         f"its schema has {in_schema}")
    return files


def refuse_stray_files(shard_paths: list[str]) -> None:
    """Anything in the shard folder that the plan did not ask for (a job's `.partial` leftover aside)."""
    planned = {Path(p).resolve() for p in shard_paths}
    for folder in sorted({path.parent for path in planned}):
        for entry in sorted(folder.iterdir()):
            if entry.resolve() not in planned and not (entry.name.startswith(".") and entry.name.endswith(".partial")):
                raise ProofError(f"stray file `{entry}` in the shard folder is not part of the plan; remove it")


def refuse_stray_folders(files_folders: list[str]) -> None:
    """Anything in the files root (`results/files`) that is not a planned shard's files folder (a
    job's `.<shard>.partial` staging leftover aside): another plan's folder, or one made by hand."""
    planned = {Path(p).absolute() for p in files_folders}
    allowed = planned | {staging_folder(p) for p in planned}
    for root in sorted({path.parent for path in planned if path.parent.is_dir()}):
        for entry in sorted(root.iterdir()):
            if entry not in allowed:
                raise ProofError(f"stray entry `{entry}` in the files folder is not a planned shard's; remove it")


def prove(plan: Plan, shard_paths: list[str], inp: InputSettings, digest: str,
          files_folders: list[str] | None = None, local_parts: list[str] | None = None,
          part_names: list[str] | None = None) -> list[ShardFile]:
    """Every proof that must hold before anything is written; returns the proven shards in order.
    `files_folders`: each shard's expected files folder, when the task may write files. `local_parts`:
    the job's storage copies of the parts, in the input's order (no shared filesystem), proven by
    their content alone: a copy's path and mtime are not the original's; `part_names`: their names
    as this job's listing of the bucket found them, which must be the planned ones."""
    if local_parts is None:
        plan.check_input_unchanged()
    else:
        refuse_other_parts(plan.input_path, part_names or [], plan.parts)
        if len(local_parts) != len(plan.parts):
            raise ProofError(f"gather got {len(local_parts)} input parts but the plan has {len(plan.parts)}")
        log.info("proving the input by its content: %d part(s) downloaded from storage", len(local_parts))
    if len(shard_paths) != plan.shards:
        raise ProofError(f"gather got {len(shard_paths)} shard files but the plan has {plan.shards} shards")
    folders = list(files_folders or [None] * plan.shards)
    if len(folders) != plan.shards:
        raise ProofError(f"gather got {len(folders)} files folders but the plan has {plan.shards} shards")
    for part, path in zip(plan.parts, local_parts or [part.path for part in plan.parts]):
        check_part(plan, part, inp, path)
    shards = [prove_shard(plan, i, path, digest, folder) for i, (path, folder) in enumerate(zip(shard_paths, folders))]
    refuse_stray_files(shard_paths)
    if files_folders:
        refuse_stray_folders(files_folders)
    with_rows = [s for s in shards if s.rows]  # an empty shard never loaded the task: custom columns unknown
    for shard in with_rows[1:]:
        if not shard.schema.equals(with_rows[0].schema):
            raise ProofError(f"shard {shard.shard} (`{shard.path}`): columns {shard.schema} differ from shard "
                             f"{with_rows[0].shard}'s {with_rows[0].schema}")
    total = sum(s.rows for s in shards)
    if total != plan.rows:
        raise ProofError(f"shards hold {total} rows in all, the input {plan.rows}")
    return shards


def check_part(plan: Plan, part: Part, inp: InputSettings, path: str | None = None) -> None:
    """Read a part once, counting its rows with its content digest alongside (a second thread):
    refuse one whose bytes are not those planned, though its size and mtime are (an edit with the
    mtime put back, or a same-sized file copied over with `cp -p`), or that holds other rows; and
    one whose staged copy, which its shards read, is not the one the plan wrote."""
    copy = path not in (None, part.path)  # read where this job finds its storage copy
    path = path or part.path
    with digest_alongside(path) as content:
        rows = count_rows(one_file(inp, path), plan.fields)
    if content.result() != part.digest:
        same = "" if copy else "same size and mtime, "
        raise ProofError(f"input `{part.path}` changed since planning: {same}other content "
                         f"({part.digest} -> {content.result()}); rerun the plan (snakemake --forcerun plan)")
    if rows != part.rows:
        raise ProofError(f"input `{part.path}` now has {rows} rows, the plan {part.rows}; rerun the plan")
    if part.staged:
        part.staged.check_content(part.path)


def verified_row_groups(shard: ShardFile) -> Iterator[pa.Table]:
    """The shard's row groups, each page checked against its checksum, and the values hashed as they
    pass: after the last one, refuse the shard if they are not what its job wrote. A shard with
    files has each one checked against its row (name, size, SHA-256), and no other file in its folder."""
    where = f"shard {shard.shard} (`{shard.path}`)"
    content, seen = ContentHasher(), set()
    try:
        file = open_verified(shard.path)
        groups = range(file.num_row_groups)
        for table in (file.read_row_group(group) for group in groups):
            content.update(table)
            if shard.files:
                with naming_the_shard(where):
                    seen |= prove_files(table, shard.files["folder"], shard.files["columns"])
            yield table
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ProofError(f"{where}: {read_fault(error)}") from error
    if content.digest() != shard.content:
        raise ProofError(f"{where}: its values are not those its job wrote (digest {content.digest()}, "
                         f"recorded {shard.content}); delete it and rerun")
    if shard.files:
        with naming_the_shard(where):
            refuse_unlisted(shard.files["folder"], seen)


@contextmanager
def naming_the_shard(where: str) -> Iterator[None]:
    """A failed file proof, prefixed with the shard it belongs to."""
    try:
        yield
    except ProofError as error:
        raise ProofError(f"{where}: {error}") from None


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


def _total(shards: list[ShardFile], key: str) -> int:
    return sum(s.stats.get(key) or 0 for s in shards)


def _computed(shards: list[ShardFile], key: str) -> int:
    """Over the shard jobs that finished the shards: what rates over their span divide."""
    return sum(computed(s.stats, key) for s in shards)


def wall_clock(shards: list[ShardFile]) -> tuple[float, float] | None:
    """The run's span: first shard job's start to last shard's end (epoch seconds), or None when a
    shard file predates these stats (a shard kept from an earlier version of the workflow)."""
    starts, ends = [s.stats.get("started") for s in shards], [s.stats.get("ended") for s in shards]
    if not shards or None in starts or None in ends:
        return None
    return min(starts), max(ends)


def run_facts(plan: Plan, shards: list[ShardFile], model: dict) -> dict:
    """The run at a glance: what ran where, and rows/s and real tokens/s over its wall time, not
    over summed shard seconds, so idle slots and start-up count against it as a user sees them."""
    real, padded, span = _total(shards, "real_tokens"), _total(shards, "padded_tokens"), wall_clock(shards)
    wall = round(span[1] - span[0], 3) if span else None
    rows, tokens = _computed(shards, "rows"), _computed(shards, "real_tokens")
    return {
        "rows": plan.rows, "shards": plan.shards, "task": model.get("task"), "model": model.get("path"),
        "adapter": model.get("adapter"), "max_length": model.get("max_length"),
        "devices": sorted({s.stats["device"] for s in shards if s.stats.get("device")}),
        "dtype": ", ".join(sorted({s.stats["dtype"] for s in shards if s.stats.get("dtype")})),
        "started": span[0] if span else None, "ended": span[1] if span else None, "wall_s": wall,
        "rows_per_s": round(rows / wall, 2) if wall else None,
        "real_tokens_per_s": round(tokens / wall, 2) if wall else None, "resumed_rows": plan.rows - rows,
        "real_tokens": real, "padded_tokens": padded,
        "padding_ratio": round(padded / real, 4) if real else None, "truncated": _total(shards, "truncated"),
        **generated_facts(shards, wall),
    }


def generated_facts(shards: list[ShardFile], wall: float | None) -> dict:
    """Tokens generated in all (task generate), and per second over the run's wall time."""
    generated = _total(shards, "generated_tokens")
    if not any("generated_tokens" in s.stats for s in shards):
        return {}
    per_s = _computed(shards, "generated_tokens") / wall if wall else None
    return {"generated_tokens": generated, "generated_tokens_per_s": round(per_s, 2) if wall else None}


def token_lengths(shards: list[ShardFile]) -> dict[str, int]:
    """Rows per real token length over all shards (sparse, by length): the report's histogram."""
    total: Counter = Counter()
    for shard in shards:
        total.update({int(length): count for length, count in (shard.stats.get("token_lengths") or {}).items()})
    return {str(length): total[length] for length in sorted(total)}


# A shard job's stats that the summary holds once for the run (the histogram), or beside them (rows).
# Every other stat a job records (a task's own, such as generated_tokens or engine_start_s) is in
# its per_shard entry as recorded: no list of them to keep here.
PER_SHARD_AGGREGATED = ("rows", "token_lengths")


def summarize(plan: Plan, shards: list[ShardFile], inp: InputSettings, model: dict) -> dict:
    run = run_facts(plan, shards, model)
    return {
        "rows": plan.rows,
        "shards": plan.shards,
        "plan_id": plan.plan_id,
        "input": inp.path,
        "model": model,
        "truncated": run["truncated"],
        "padding_ratio": run["padding_ratio"],
        "per_shard": [
            {"shard": s.shard, "start": plan.ranges[s.shard][0], "end": plan.ranges[s.shard][1], "rows": s.rows,
             "estimated_tokens": plan.costs[s.shard],
             **{k: v for k, v in s.stats.items() if k not in PER_SHARD_AGGREGATED}}
            for s in shards
        ],
        "run": run,
        "token_lengths": token_lengths(shards),
    }


def refuse_no_columns(plan: Plan, task: str | None) -> None:
    """An input without rows gives a table of the task's declared columns (`Task.outputs`); a task
    whose columns are known only once its code loads in a shard job with rows (custom) has none."""
    if plan.rows == 0 and task in TASKS and not task_class(task).outputs:
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
    log.info("proof holds: %d shards, %d rows, index 0..%d in order, input unchanged", plan.shards, plan.rows, plan.rows - 1)
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
