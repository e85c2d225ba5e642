"""The proof: the shard files add up to the input, row for row, before gather writes anything.

The plan says what must exist. Every check holds or gather writes nothing: the input is unchanged
(the same parts, each of the planned size, mtime, content digest and rows), each planned shard file
belongs to this plan and these settings, and its `index` column is exactly its planned range, in
order. While gather concatenates (`shardinfer.proof.gather`), each shard's values are hashed as
they pass and checked against the digest its job recorded (`verified_row_groups`), and its files
per row against their rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.config import InputSettings
from shardinfer.contract.content_digest import CONTENT_KEY, ContentHasher
from shardinfer.contract.row_files import prove_files, refuse_unlisted, staging_folder
from shardinfer.contract.shard_file import FILE_TYPE, IDENTITY_KEY, INDEX_COLUMN, STATS_KEY
from shardinfer.errors import ProofError
from shardinfer.input.identity import digest_alongside
from shardinfer.input.parts import Part, one_file, refuse_other_parts
from shardinfer.input.scan import count_rows
from shardinfer.plan import Plan

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
        raise ProofError(f"{where}: made under another plan ({identity.get('plan_id')}, current {plan.plan_id}); "
                         "rerun it")
    if (identity.get("shard"), identity.get("start"), identity.get("end")) != (shard, start, end):
        raise ProofError(f"{where}: holds shard {identity.get('shard')} [{identity.get('start')}, "
                         f"{identity.get('end')}), planned [{start}, {end})")
    if identity.get("digest") != digest:
        raise ProofError(f"{where}: made with other model or output settings ({identity.get('digest')}, current "
                         f"{digest}); rerun it")
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
