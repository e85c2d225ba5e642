"""One shard's proof, from its metadata and its `index` column alone: every piece (one file, or the
pieces its job rolled over to: `shardinfer.contract.pieces`) belongs to this plan, range and settings
digest, carries the digest of its values, and its index runs through the shard's planned range in
order. The index is read a row group at a time, so gather's memory does not grow with a shard's rows.

The values are not read here. A shard whose every piece still has the stat identity its job
recorded (size, mtime, ctime, inode) holds the bytes its job hashed as it wrote them: it is
`unchanged`, and gather takes it as it is. Any other shard (copied, touched, edited, or written
before records existed) has its bytes or values checked again before anything is written
(`shardinfer.proof.values`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.contract.content_digest import CONTENT_KEY
from shardinfer.contract.pieces import PIECE_KEY, later_pieces, piece_path, read_record, record_path, stat_identity
from shardinfer.contract.shard_file import FILE_TYPE, IDENTITY_KEY, INDEX_COLUMN, STATS_KEY
from shardinfer.core.errors import ProofError
from shardinfer.plan.plan_file import Plan

log = logging.getLogger(__name__)
INDEX_BATCH = 1 << 16  # index values checked at a time


@dataclass(frozen=True)
class Piece:
    """One file of a shard: its rows start at `first`; `content`, the digest of its values its footer
    holds; `sha256` and `stat`, what its job's record says of its bytes (None: no record)."""

    path: str
    first: int
    rows: int
    content: str
    sha256: str | None = None
    stat: dict | None = None


@dataclass(frozen=True)
class ShardFile:
    shard: int
    path: str
    rows: int
    schema: pa.Schema
    stats: dict
    content: str  # the digest of its first piece's values its job recorded (shardinfer.contract.content_digest)
    files: dict | None = None  # {"folder", "columns": {column: suffix}} when the task may write files
    pieces: tuple[Piece, ...] = ()  # its files in row order (empty: the one file at `path`)
    unchanged: bool = False  # each piece has the stat identity its record holds: the bytes its job wrote
    record: dict | None = field(default=None, compare=False)  # the job's record, when it has one
    identity: dict | None = field(default=None, compare=False)  # the identity its files say they have

    @property
    def files_in_order(self) -> tuple[Piece, ...]:
        return self.pieces or (Piece(self.path, 0, self.rows, self.content),)

    @property
    def bytes(self) -> int:
        return sum(Path(piece.path).stat().st_size for piece in self.files_in_order)


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


def metadata(file: pq.ParquetFile, key: bytes) -> dict | None:
    raw = (file.metadata.metadata or {}).get(key)
    return json.loads(raw) if raw else None


def open_verified(path: str) -> pq.ParquetFile:
    """A Parquet file whose pages are checked against their CRC32 as they are read (written by
    `atomic_parquet_writer` and the shard's pieces): bit rot on disk is an error, not wrong values."""
    return pq.ParquetFile(path, page_checksum_verification=True)


def read_fault(error: Exception) -> str:
    """What a failed read means, in a few words: a page failing its checksum, or anything else."""
    first = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
    if "checksum" in first.lower():
        return f"damaged: a page fails its checksum ({first})"
    return f"unreadable or truncated parquet ({first})"


def index_runs_on(file: pq.ParquetFile, first: int) -> int | None:
    """The row after the piece's last when its index is first, first+1, ... in order, a batch of
    the column at a time; None as soon as it is not."""
    expected = first
    for batch in file.iter_batches(batch_size=INDEX_BATCH, columns=[INDEX_COLUMN]):
        index = batch.column(0)
        if index.null_count or not np.array_equal(index.to_numpy(), np.arange(expected, expected + len(index))):
            return None
        expected += len(index)
    return expected


def index_fault(paths: list[str], start: int, end: int) -> str:
    """What is wrong with the shard's index over all its pieces, read whole: only once it is wrong."""
    columns = [pq.read_table(path, columns=[INDEX_COLUMN]).column(0) for path in paths]
    nulls = sum(column.null_count for column in columns)
    if nulls:
        return f"{nulls} null value(s) in `{INDEX_COLUMN}`"
    return describe_index_fault(np.concatenate([column.to_numpy() for column in columns]), start, end)


def piece_paths(path: str, record: dict | None, where: str) -> list[str]:
    """The shard's files in order: the shard file, then the pieces beside it; those its record names."""
    found = [path, *map(str, later_pieces(path))]
    if record is not None:
        named = [str(piece_path(path, k)) for k in range(len(record.get("pieces") or [None]))]
        missing = [p for p in named if p not in found]
        if missing:
            raise ProofError(f"{where}: piece `{missing[0]}` its job wrote is missing; rerun its infer job")
        extra = [p for p in found if p not in named]
        if extra:
            raise ProofError(f"{where}: `{extra[0]}` is not a piece its job wrote; remove it")
    return found


def check_identity(plan: Plan, shard: int, identity: dict, where: str, digest: str) -> None:
    """A shard's files (or record) say they are this plan's shard, its range and settings digest."""
    start, end = plan.ranges[shard]
    if identity.get("plan_id") != plan.plan_id:
        raise ProofError(f"{where}: made under another plan ({identity.get('plan_id')}, current {plan.plan_id}); "
                         "rerun it")
    if (identity.get("shard"), identity.get("start"), identity.get("end")) != (shard, start, end):
        raise ProofError(f"{where}: holds shard {identity.get('shard')} [{identity.get('start')}, "
                         f"{identity.get('end')}), planned [{start}, {end})")
    if identity.get("digest") != digest:
        raise ProofError(f"{where}: made with other model or output settings ({identity.get('digest')}, current "
                         f"{digest}); rerun it")


def footer(plan: Plan, shard: int, path: str, k: int, where: str, digest: str) -> tuple[pq.ParquetFile, dict]:
    """A piece's file and the place its footer names, once its identity is this shard's."""
    file = open_verified(path)
    identity, place = metadata(file, IDENTITY_KEY), metadata(file, PIECE_KEY) or {"piece": 0}
    if identity is None or INDEX_COLUMN not in file.schema_arrow.names:
        raise ProofError(f"{where}: not a shard file of this workflow (no shard identity or `{INDEX_COLUMN}` column)")
    check_identity(plan, shard, identity, where, digest)
    if place.get("piece") != k:
        raise ProofError(f"{where}: says it is piece {place.get('piece')} of its shard, found as piece {k}")
    if not (metadata(file, CONTENT_KEY) or {}).get("digest"):
        raise ProofError(f"{where}: its metadata holds no digest of its values, which its infer job always writes "
                         "(the file was rewritten by another tool, or its metadata edited); delete it and rerun its "
                         "infer job")
    return file, identity


def prove_shard(plan: Plan, shard: int, path: str, digest: str, folder: str | None = None) -> ShardFile:
    """Check one shard's files against its planned range (and its files per row against `folder`, the
    shard's expected files folder when the task may write files); raise ProofError naming the fault."""
    start, end = plan.ranges[shard]
    where = f"shard {shard} (`{path}`)"
    if not Path(path).is_file():
        raise ProofError(f"{where}: file is missing; rerun its infer job")
    record = read_record(record_path(path))
    paths = piece_paths(path, record, where)
    pieces, row, schema, identity, stats = [], start, None, None, {}
    for k, piece in enumerate(paths):
        here = where if k == 0 else f"shard {shard} (`{piece}`)"
        try:
            file, identity = footer(plan, shard, piece, k, here, digest)
            after = index_runs_on(file, row)
            if after is None or after > end:
                raise ProofError(f"{where}: {index_fault(paths, start, end)}")
            if schema is not None and not file.schema_arrow.remove_metadata().equals(schema):
                raise ProofError(f"{here}: its columns differ from its shard's first piece's")
            schema, stats = file.schema_arrow.remove_metadata(), metadata(file, STATS_KEY) or {}
            pieces.append(Piece(piece, row, after - row, metadata(file, CONTENT_KEY)["digest"]))
            row = after
        except (pa.ArrowException, OSError, ValueError) as error:
            raise ProofError(f"{here}: {read_fault(error)}") from error
    if row != end:
        raise ProofError(f"{where}: {index_fault(paths, start, end)}")
    pieces, unchanged = with_record(pieces, record, identity)
    return ShardFile(shard=shard, path=path, rows=end - start, schema=schema, stats=stats, content=pieces[0].content,
                     files=files_identity(where, identity, schema, folder), pieces=tuple(pieces), unchanged=unchanged,
                     record=record, identity=identity)


def with_record(pieces: list[Piece], record: dict | None, identity: dict) -> tuple[list[Piece], bool]:
    """The pieces with what the job's record says of their bytes, and whether each still has the stat
    identity recorded (the record names this shard's identity and these pieces' values)."""
    recorded = (record or {}).get("pieces") or []
    if record is None or record.get("identity") != identity or len(recorded) != len(pieces):
        return pieces, False
    if any((r.get("first"), r.get("rows"), r.get("content")) != (p.first, p.rows, p.content)
           for r, p in zip(recorded, pieces)):
        return pieces, False
    pieces = [Piece(p.path, p.first, p.rows, p.content, r.get("sha256"), r.get("stat"))
              for p, r in zip(pieces, recorded)]
    return pieces, all(stat_identity(p.path) == p.stat for p in pieces)


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


def prove_recorded(plan: Plan, shard: int, record: str, name: str, digest: str) -> ShardFile:
    """Without a shared filesystem, a shard whose file its job wrote straight into the bucket as a part
    (`name`), proven by the record its job wrote with it, which gather downloads instead of the values:
    this plan's shard, range and settings, one piece of exactly its rows, with its digests."""
    start, end = plan.ranges[shard]
    where = f"shard {shard} (`{name}`)"
    content = read_record(record)
    if content is None:
        raise ProofError(f"{where}: its record `{record}` is missing or not a shard record; rerun its infer job")
    check_identity(plan, shard, content.get("identity") or {}, where, digest)
    pieces = content.get("pieces") or []
    if len(pieces) != 1 or (pieces[0].get("first"), pieces[0].get("rows")) != (start, end - start):
        raise ProofError(f"{where}: its record holds {len(pieces)} piece(s), not one piece of rows [{start}, {end}); "
                         "rerun its infer job")
    piece = pieces[0]
    if not piece.get("content") or not piece.get("sha256"):
        raise ProofError(f"{where}: its record holds no digest of its values or bytes; rerun its infer job")
    return ShardFile(shard=shard, path=name, rows=end - start, schema=None, stats=content.get("stats") or {},
                     content=piece["content"], pieces=(Piece(name, start, end - start, piece["content"],
                                                             piece["sha256"], piece.get("stat")),),
                     unchanged=True, record=content, identity=content["identity"])
