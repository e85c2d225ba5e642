"""Shard cuts: each shard's rows written out by the plan, for jobs that share no filesystem.

Without a shared filesystem (a default storage provider: S3, GCS, ... with Kubernetes, cloud batch
or `--shared-fs-usage none`), a job sees only its declared `input:` files, each downloaded whole:
storage plugins have no range reads. A shard job that declared the input would download all of
it, shards x input in all. So the plan, which reads the input once anyway, writes each shard's rows
(the columns the shards read, in the plan's types over all parts) as a Parquet file of their own,
`results/cuts/<shard>.parquet`, one output per shard; each shard job declares only its own. All
shard jobs together then download about the input's read columns once (scripts/benchmarks/load_check.py
measures it).

The plan records each cut's rows, size and SHA-256; a shard job refuses a cut of other bytes
before it reads a row, and gather proves the input itself by its content digest as it always does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from shardinfer.contract.file_digest import file_digest
from shardinfer.core.atomic import atomic_parquet_writer
from shardinfer.core.errors import UserError
from shardinfer.input.parts import Part, Piece, windows
from shardinfer.settings.config import InputSettings

# The format cuts are written in, and read in by the shard and tokenize jobs.
CUT_FORMAT = "parquet"
CUT_ROW_GROUP = 8192  # rows per row group of a cut


@dataclass(frozen=True)
class Cut:
    """One shard's cut as the plan wrote it. Its path is the plan rule's output, which each job
    finds where its storage copy lies (`snakemake.input.cut`), so the plan stores none."""
    rows: int
    size: int
    digest: str  # `sha256:<hex>` of its bytes

    @classmethod
    def from_json(cls, data: dict) -> Cut:
        return cls(**data)

    def check(self, path: str, shard: int) -> None:
        """Refuse a copy of the cut that is not the one planned (another plan's, or damaged)."""
        if not Path(path).is_file():
            raise UserError(f"shard {shard}: its cut `{path}` is missing; rerun the plan")
        found = file_digest(path)
        if found != self.digest:
            raise UserError(f"shard {shard}: its cut `{path}` is not the one planned ({self.digest} -> {found}); "
                            "rerun the plan (snakemake --forcerun plan)")


def whole_parts(pieces: tuple[tuple[Piece, ...], ...]) -> tuple[Piece, ...]:
    """Every shard's pieces as one piece per part, from its first planned row to its last: the input
    read once, in order (a compressed part cannot seek, so reading it shard by shard would decompress
    it from its start for each)."""
    merged: dict[str, Piece] = {}
    for piece in (piece for shard in pieces for piece in shard):
        first = merged.get(piece.part.path)
        if first is None:
            merged[piece.part.path] = piece
        else:
            span = first.span and dataclasses.replace(first.span, stop=piece.span.stop)
            merged[piece.part.path] = dataclasses.replace(first, end=piece.end, span=span)
    return tuple(merged.values())


def write_cuts(batches: Iterator[tuple[int, pa.RecordBatch]], ranges: tuple[tuple[int, int], ...],
               schema: pa.Schema, paths: list[str]) -> tuple[Cut, ...]:
    """Split the input's rows (`batches`: (first row, batch) in row order, in the plan's types) at the
    shards' `ranges` into their cuts (`paths`), each a Parquet file written atomically, with page
    checksums and zstd, in row groups of CUT_ROW_GROUP rows; a shard without rows gets one without."""
    tables = windows(batches, CUT_ROW_GROUP)
    pending, cuts = next(tables, None), []
    for (start, end), path in zip(ranges, paths):
        rows = 0
        with atomic_parquet_writer(path, schema, compression="zstd") as writer:
            while pending is not None and pending[0] < end:
                first, table = pending
                take = min(table.num_rows, end - first)
                writer.write_table(table.slice(0, take).cast(schema))
                rows += take
                rest = table.slice(take)
                pending = (first + take, rest) if rest.num_rows else next(tables, None)
        if rows != end - start:
            raise UserError(f"the plan's cut of shard rows [{start}, {end}) got {rows} rows; rerun the plan")
        cuts.append(Cut(rows=rows, size=Path(path).stat().st_size, digest=file_digest(path)))
    return tuple(cuts)


def cut_part(cut: Cut, path: str, first_row: int) -> Part:
    """The cut as the one part its shard job reads: its rows are the input's from `first_row` on."""
    return Part(path=path, first_row=first_row, rows=cut.rows, size=cut.size, mtime_ns=0, digest=cut.digest)


def cut_pieces(part: Part, shard: int, shards: int) -> tuple[tuple[Piece, ...], ...]:
    """Every shard's pieces as a job holding only shard `shard`'s cut sees them: its rows in the cut,
    nothing of the others."""
    own = (Piece(part, 0, part.rows, None),) if part.rows else ()
    return tuple(own if k == shard else () for k in range(shards))


def read_as_cut(inp: InputSettings) -> InputSettings:
    """The input settings for reading a cut: its format, whatever the input's own is."""
    return dataclasses.replace(inp, format=CUT_FORMAT)
