"""The input's parts as planned and read: each file of a directory or glob input (a single file is
one part) with its place in the row numbering and its identity, and a shard's range read part by part.

Rows are numbered across the parts in their order (`shardinfer.input.discovery`): part k's rows begin where
part k-1's end. A shard's range becomes pieces, one per part it overlaps, each a range of that
part's own rows that its format reads exactly as it reads a single-file input (from its span
for a text format, its row groups for Parquet, its batches for Arrow). Shards may so span parts,
and each part is read by the shards that hold its rows, not by all of them.

Every read column gets one type over all parts, so that all shards write one schema
(`Format.fields`): Parquet and Arrow parts are typed together from their schemas before anything
is read, by exact widening only (string and large_string give large_string, int32 and int64 or
uint32 give int64: writers differ); CSV is all text; JSONL parts are typed together, so a field
that only some parts carry is null in the others, as for rows of one file.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.input.discovery import resolve_input
from shardinfer.input.formats import format_named
from shardinfer.input.formats.base import Span
from shardinfer.input.identity import digest_alongside, fingerprint
from shardinfer.input.scan import NULLS_LISTED, InputScan, scan_input
from shardinfer.input.staging import Staged
from shardinfer.settings.config import InputSettings


@dataclass(frozen=True)
class Part:
    """One file of the input as planned: where its rows begin in the input, how many, and its identity."""
    path: str
    first_row: int
    rows: int
    size: int
    mtime_ns: int
    digest: str  # `sha256:<hex>` of its bytes when it was planned (shardinfer.input.identity)
    staged: Staged | None = None  # the copy its shards read instead, if the plan made one (shardinfer.input.staging)

    @property
    def read_path(self) -> str:
        """The file its shards read: its staged copy, or itself."""
        return self.staged.path if self.staged else self.path

    @classmethod
    def from_json(cls, data: dict) -> Part:
        staged = data.get("staged")
        return cls(**{**data, "staged": staged and Staged.from_json(staged)})

    def check_unchanged(self) -> None:
        """Refuse a part that has disappeared, or has another size or mtime, since planning; and the
        same of its staged copy."""
        if self.staged:
            self.staged.check_unchanged(self.path)
        if not os.path.isfile(self.path):
            raise UserError(f"input `{self.path}` has disappeared since planning; rerun the plan")
        now, then = fingerprint(self.path), {"size": self.size, "mtime_ns": self.mtime_ns}
        if now != then:
            raise UserError(f"input `{self.path}` changed since planning (size/mtime {then} -> {now}); "
                            "rerun the plan (the next snakemake run replans)")


@dataclass(frozen=True)
class Piece:
    """A shard's rows in one part: rows [start, end) in the part's own numbering, and where they lie
    in it (the format's span; None for a format without positions, which reads any row range
    directly or from the start)."""
    part: Part
    start: int
    end: int
    span: Span | None


def one_file(inp: InputSettings, path: str) -> InputSettings:
    """The settings of one part, for the format's single-file readers."""
    return dataclasses.replace(inp, path=path, parts=(path,))


def iter_pieces(inp: InputSettings, pieces: tuple[Piece, ...], fields: pa.Schema | None = None,
                from_row: int = 0) -> Iterator[tuple[int, pa.RecordBatch]]:
    """A shard's rows as (the input's row number of the batch's first row, batch), piece by piece,
    each from its part's staged copy where the plan made one, in the plan's types over all parts
    (`fields`: `Format.fields`). Rows before `from_row` (the input's numbering) are passed over: a
    resumed shard's kept rows; a format that reads any row range starts there, a text format reads
    its piece's span and drops them."""
    fmt = format_named(inp.format)
    for piece in pieces:
        offset = piece.part.first_row
        if offset + piece.end <= from_row:
            continue
        if piece.part.staged:
            piece.part.staged.check_holds(inp.read_columns, piece.part.path)
        part = one_file(inp, piece.part.read_path)
        start = max(piece.start, from_row - offset) if piece.span is None else piece.start
        for first, batch in fmt.read_range(part, start, piece.end, piece.span, fields):
            skip = min(max(from_row - offset - first, 0), batch.num_rows)
            if skip < batch.num_rows:
                yield offset + first + skip, batch.slice(skip)


def windows(batches: Iterator[tuple[int, pa.RecordBatch]], size: int, first_size: int | None = None
            ) -> Iterator[tuple[int, pa.Table]]:
    """Regroup (first row, batch) pairs into tables of `size` rows (the last may be shorter).

    The first table may be smaller (`first_size`), so that the stages after it start sooner.
    """
    pending, first, want = [], None, first_size or size
    for start, batch in batches:
        first = start if first is None else first
        pending.append(batch)
        table = pa.Table.from_batches(pending)
        while table.num_rows >= want:
            yield first, table.slice(0, want)
            first, table, want = first + want, table.slice(want), size
        pending = table.to_batches()
    if pending and sum(b.num_rows for b in pending) > 0:
        yield first, pa.Table.from_batches(pending)


def check_same_parts(path: str, parts: tuple[Part, ...], section: dict | None = None) -> None:
    """Refuse an input whose files are not the planned ones: `path` resolved again (a directory
    listed, a glob matched, a dataset's state read, with the format options of the input `section`
    as planned) must give the planned parts, no more and no fewer."""
    refuse_other_parts(path, resolve_input(path, section=section)[1], parts)


def refuse_other_parts(path: str, now: tuple[str, ...] | list[str], parts: tuple[Part, ...]) -> None:
    """Refuse parts `now` (the input as found again: on disk, or in a bucket's listing) that are not
    the planned `parts`, naming the first one added or renamed, or gone, since planning."""
    planned = [part.path for part in parts]
    known, present = set(planned), set(now)
    added = [name for name in now if name not in known]
    if added:
        raise UserError(f"input `{path}`: `{added[0]}` is not a part of the plan (added or renamed since planning; "
                        f"{len(added)} such file(s)); rerun the plan (the next snakemake run replans)")
    gone = [name for name in planned if name not in present]
    if gone:
        raise UserError(f"input `{gone[0]}` has disappeared since planning; rerun the plan")


@dataclass(frozen=True)
class PartsScan:
    """The plan's scan of every part: each part as planned, its scan, and the JSONL fields."""
    parts: tuple[Part, ...]
    scans: tuple[InputScan, ...]
    fields: pa.Schema | None  # the types every part is read in (`Format.fields`), or None

    @property
    def rows(self) -> int:
        return sum(part.rows for part in self.parts)

    @property
    def null_texts(self) -> int:
        return sum(scan.null_texts for scan in self.scans)

    def first_null_rows(self) -> tuple[int, ...]:
        rows = (part.first_row + row for part, scan in zip(self.parts, self.scans) for row in scan.first_null_rows)
        return tuple(itertools.islice(rows, NULLS_LISTED))

    def chars(self) -> np.ndarray:
        """Characters of each row's text, in the input's row order."""
        return self.scans[0].chars if len(self.scans) == 1 else np.concatenate([scan.chars for scan in self.scans])

    def images(self) -> np.ndarray | None:
        """Images per row (input.image_column), in the input's row order; None without the column."""
        if self.scans and self.scans[0].images is None:
            return None
        return np.concatenate([scan.images for scan in self.scans]) if self.scans else np.zeros(0, dtype=np.int32)

    def image_names(self) -> list[tuple[int, str]]:
        """(the input's row, name) of each image given by path, in row order."""
        return [(part.first_row + row, name) for part, scan in zip(self.parts, self.scans)
                for row, name in scan.image_names]

    def pieces(self, ranges: list[tuple[int, int]]) -> tuple[tuple[Piece, ...], ...]:
        """Each range of the input as pieces of the parts that hold its rows (none for an empty
        range). Each part finds the ranges it holds by bisection and their spans in one call, so
        that 10,000 shards of a large file cost milliseconds, not a pass over its marks each."""
        starts, ends = [start for start, _ in ranges], [end for _, end in ranges]
        found: list[list[Piece]] = [[] for _ in ranges]
        for part, scan in zip(self.parts, self.scans):
            begin, stop = part.first_row, part.first_row + part.rows
            held = [(k, max(starts[k], begin) - begin, min(ends[k], stop) - begin)
                    for k in range(bisect.bisect_right(ends, begin), bisect.bisect_left(starts, stop))]
            held = [(k, lo, hi) for k, lo, hi in held if lo < hi]
            for (k, lo, hi), span in zip(held, scan.spans([(lo, hi) for _, lo, hi in held])):
                found[k].append(Piece(part, lo, hi, span))
        return tuple(tuple(pieces) for pieces in found)


def scan_parts(inp: InputSettings) -> PartsScan:
    """Scan every part in order, each with its content digest alongside, once the parts' read
    columns are typed together (`Format.fields`)."""
    fields = format_named(inp.format).fields(inp)
    parts, scans, first_row = [], [], 0
    for path in inp.files:
        part, scan = _scan_part(one_file(inp, path), first_row, fields)
        parts.append(part)
        scans.append(scan)
        first_row += part.rows
    return PartsScan(tuple(parts), tuple(scans), fields)


def _scan_part(inp: InputSettings, first_row: int, fields: pa.Schema | None) -> tuple[Part, InputScan]:
    """One part's scan and identity; a part that changes while it is read is refused."""
    stamp = fingerprint(inp.path)
    with digest_alongside(inp.path) as digest:
        scan = scan_input(inp, fields)
    content = digest.result()
    if fingerprint(inp.path) != stamp:
        raise UserError(f"input `{inp.path}` changed while it was being planned; rerun the plan once it is complete")
    return Part(inp.path, first_row, scan.rows, stamp["size"], stamp["mtime_ns"], content), scan
