"""The input's parts as planned and read: each file of a directory or glob input (a single file is
one part) with its place in the row numbering and its identity, and a shard's range read part by part.

Rows are numbered across the parts in their order (`shardinfer.input.discovery`): part k's rows begin where
part k-1's end. A shard's range becomes pieces, one per part it overlaps, each a range of that
part's own rows that `shardinfer.input.scan` reads exactly as it reads a single-file input (from its
span for CSV/JSONL, its row groups for Parquet). Shards may so span parts, and each part is read
by the shards that hold its rows, not by all of them.

Every read column gets one type over all parts, so that all shards write one schema: Parquet
parts are typed together from their footers before anything is read, by exact widening only
(string and large_string give large_string, int32 and int64 or uint32 give int64: writers
differ), and read
in those types; CSV is all text; JSONL parts are typed together, so a field that only some parts
carry is null in the others, as for rows of one file.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.config import InputSettings
from shardinfer.errors import UserError
from shardinfer.input.identity import digest_alongside, fingerprint
from shardinfer.input.discovery import input_parts
from shardinfer.input.staging import Staged
from shardinfer.input.scan import (NULLS_LISTED, FieldConflict, InputScan, Span, iter_range, jsonl_fields, merge_fields,
                               reading, scan_input)


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
    in it (CSV/JSONL; None for Parquet, whose row groups are its index)."""
    part: Part
    start: int
    end: int
    span: Span | None


def one_file(inp: InputSettings, path: str) -> InputSettings:
    """The settings of one part, for the single-file readers of `shardinfer.input.scan`."""
    return dataclasses.replace(inp, path=path, parts=(path,))


def iter_pieces(inp: InputSettings, pieces: tuple[Piece, ...], fields: pa.Schema | None = None
                ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """A shard's rows as (the input's row number of the batch's first row, batch), piece by piece,
    each from its part's staged copy where the plan made one. Parquet parts whose types differ are
    cast to `fields`, the plan's types over all parts (`parquet_fields`)."""
    cast = pa.schema([fields.field(c) for c in inp.read_columns]) if fields and inp.format == "parquet" else None
    for piece in pieces:
        if piece.part.staged:
            piece.part.staged.check_holds(inp.read_columns, piece.part.path)
        for first, batch in iter_range(one_file(inp, piece.part.read_path), piece.start, piece.end, piece.span):
            yield piece.part.first_row + first, batch if cast is None else _cast(batch, cast)


def _cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A Parquet part's batch in the types of all parts: a widening, which holds every value exactly
    (`common_type`). By position: a kept text column is read twice under one name."""
    return pa.RecordBatch.from_arrays([column.cast(field.type) for column, field in zip(batch.columns, schema)],
                                      schema=schema)


def check_same_parts(path: str, parts: tuple[Part, ...]) -> None:
    """Refuse an input whose files are not the planned ones: `path` resolved again (a directory
    listed, a glob matched) must give the planned parts, no more and no fewer."""
    now, planned = input_parts(path), [part.path for part in parts]
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
    fields: pa.Schema | None  # JSONL: every field of every part, one type each; Parquet: see parquet_fields

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
        return np.concatenate([scan.chars for scan in self.scans])

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
    columns are typed together."""
    unified = parquet_fields(inp)
    fields = fields_of_parts(inp.files) if inp.format == "jsonl" else None
    parts, scans, first_row = [], [], 0
    for path in inp.files:
        part, scan = _scan_part(one_file(inp, path), first_row, fields)
        parts.append(part)
        scans.append(scan)
        first_row += part.rows
    return PartsScan(tuple(parts), tuple(scans), fields or unified)


def _scan_part(inp: InputSettings, first_row: int, fields: pa.Schema | None) -> tuple[Part, InputScan]:
    """One part's scan and identity; a part that changes while it is read is refused."""
    stamp = fingerprint(inp.path)
    with digest_alongside(inp.path) as digest:
        scan = scan_input(inp, fields)
    content = digest.result()
    if fingerprint(inp.path) != stamp:
        raise UserError(f"input `{inp.path}` changed while it was being planned; rerun the plan once it is complete")
    return Part(inp.path, first_row, scan.rows, stamp["size"], stamp["mtime_ns"], content), scan


def fields_of_parts(paths: tuple[str, ...]) -> pa.Schema:
    """Every JSONL field of every part, one type each, as the rows of one file are typed."""
    fields = pa.schema([])
    for path in paths:
        try:
            fields = merge_fields(fields, jsonl_fields(path))
        except FieldConflict as conflict:
            raise UserError(f"input `{path}`: column `{conflict.column}` holds {conflict.after} here and "
                            f"{conflict.before} in the parts before it; give it one type") from None
    return fields


def parquet_fields(inp: InputSettings) -> pa.Schema | None:
    """The read columns' types over all Parquet parts, from their footers before anything is read:
    None when every part gives each column one type; else each column's type that holds every
    part's values exactly (`common_type`); a column no such type holds is refused. A column missing
    from a part is named by its scan."""
    if inp.format != "parquet":
        return None
    found: dict[str, list[tuple[str, pa.DataType]]] = {}
    for path in inp.files:
        for column, kind in _column_types(path, inp.read_columns).items():
            found.setdefault(column, []).append((path, kind))
    fields = [pa.field(column, _one_type(column, types)) for column, types in found.items()]
    differ = any(kind != field.type for field in fields for _, kind in found[field.name])
    return pa.schema(fields) if differ else None


def _one_type(column: str, types: list[tuple[str, pa.DataType]]) -> pa.DataType:
    """The one type of a column that the parts give these (part, type) pairs, in part order."""
    merged = types[0][1]
    for k, (path, kind) in enumerate(types[1:], start=1):
        widened = common_type(merged, kind)
        if widened is None:
            first, before = next(((p, t) for p, t in types[:k] if common_type(t, kind) is None), types[0])
            raise UserError(f"input `{path}`: column `{column}` holds {kind}, but `{first}` holds {before}, and no "
                            "type holds both exactly (allowed across parts: string and large_string, integers or "
                            "floats of other widths, uint into a wider int, a dictionary and its values, null)")
        merged = widened
    return merged


def common_type(one: pa.DataType, other: pa.DataType) -> pa.DataType | None:
    """The type that holds the values of both exactly, by widening only (writers differ: Spark writes
    string and int32 where pandas writes large_string and int64; a categorical is a dictionary);
    None when there is none (numbers and text, uint64 and int64, int and float, other units)."""
    one, other = (t.value_type if pa.types.is_dictionary(t) else t for t in (one, other))
    if one == other or pa.types.is_null(other):
        return one
    if pa.types.is_null(one):
        return other
    for family in ((pa.string(), pa.large_string()), (pa.binary(), pa.large_binary())):
        if one in family and other in family:
            return family[1]
    for same_kind in (pa.types.is_signed_integer, pa.types.is_unsigned_integer, pa.types.is_floating):
        if same_kind(one) and same_kind(other):
            return max(one, other, key=lambda t: t.bit_width)
    signed, unsigned = sorted((one, other), key=pa.types.is_unsigned_integer)
    if pa.types.is_signed_integer(signed) and pa.types.is_unsigned_integer(unsigned):
        return signed if signed.bit_width > unsigned.bit_width else None  # int64 holds every uint32
    if _is_list(one) and _is_list(other):
        values = common_type(one.value_type, other.value_type)
        large = pa.types.is_large_list(one) or pa.types.is_large_list(other)
        return values and (pa.large_list(values) if large else pa.list_(values))
    return None


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _column_types(path: str, columns: list[str]) -> dict[str, pa.DataType]:
    """The types of those columns a Parquet file holds once, from its footer."""
    with reading(path, "parquet"):
        schema = pq.read_schema(path)
    return {column: schema.field(i).type for column in columns if (i := schema.get_field_index(column)) >= 0}
