"""The format interface: everything the stages ask of an input format, and nothing more.

No stage tests a format by its name. Discovery asks which format a file name or a folder is;
the plan's scan asks for a file's columns, the types its parts are read in and its rows in
batches (each with the format's position where a shard may start reading); a shard job asks for
a row range; staging asks how many rows its shards would read in place and for a copy they can
read by range; the shard-count check asks for an exact or upper bound on the rows; gather asks
for the row count. A format is one module in this package defining `FORMATS` (see
`shardinfer.input.formats`); tests/test_format_contract.py holds every registered one to the
contract (the same rows as Parquet, and a last shard that reads less than the whole file).

A position is the format's own: a small JSON value (a text format's line and byte offset, an
Arrow IPC file's batch number) that the plan stores and hands back to the format, and never
reads. A format's settings are its own too: a frozen `FormatOptions` built from its section of
the input (`input.csv: {delimiter: ";"}`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.settings.config import InputSettings

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".lz4", ".zst")  # what Arrow decompresses by the name (pa.input_stream)
Held = list[tuple[int, int]]  # the shards' row ranges in one part, in the part's own numbering


def compressed(path: str) -> bool:
    """Whether Arrow reads the file through a decompressor (so it cannot seek), as its name says."""
    return path.endswith(COMPRESSED_SUFFIXES)


# A place in a file where a shard may start reading, as its format says it (JSON: numbers, strings,
# lists and dicts of them); only the format reads it.
Position = Any


@dataclass(frozen=True)
class Mark:
    """Where a shard may start reading a file: the format's `position` there, and `row`, the first
    row (the file's own numbering) that reading from it gives."""
    row: int
    position: Position


@dataclass(frozen=True)
class Span:
    """The part of a file that holds a shard's rows, from the plan: reading starts at the format's
    position `at`, where row `row` begins (at or before the shard's first row), and stops before
    position `stop`, the first after its last row (None: the file's end). `fields`: the types the
    file is read in, from the plan (JSONL: typed over every part), so that no shard has to type
    them again by reading it all."""
    row: int
    at: Position
    stop: Position | None
    fields: pa.Schema | None = None

    def to_json(self) -> dict:
        return {"row": self.row, "at": self.at, "stop": self.stop}

    @classmethod
    def from_json(cls, data: dict, fields: pa.Schema | None) -> Span:
        return cls(data["row"], data["at"], data["stop"], fields)


@dataclass(frozen=True)
class FormatOptions:
    """A format's own settings: its section of the input (`input.csv: {delimiter: ";"}`), frozen.
    A format without settings keeps this empty one; one with settings subclasses it (a field per
    option, None when unset), names it as its `options_type`, checks the values in `check`, and
    describes its section in the schema. The input's other formats' sections are refused when the
    Snakefile loads (`shardinfer.input.formats.options_in`)."""

    def check(self, key: Callable[[str], str]) -> None:
        """Refuse a value the format cannot follow, in one line naming its key as configured
        (`key("delimiter")`: `input.csv.delimiter`, or today's flat `input.delimiter`)."""


class Format:
    """One input format. Stateless: each is one instance, found by name or by a file's name."""

    name: ClassVar[str]  # what `input.format` says
    extensions: ClassVar[tuple[str, ...]] = ()  # lower case, with the dot
    # True: found by no file name or folder, only when `input.format` names it (its files share
    # another format's extension: an OpenAI batch file is JSONL)
    named_only: ClassVar[bool] = False
    compressible: ClassVar[bool] = False  # names may end in .gz, .bz2, .lz4, .zst (read through a decompressor)
    staged_suffix: ClassVar[str | None] = None  # its staged copies' suffix; None: never staged
    # Files whose presence at a folder's top lays the folder out in this format's own way
    # (`folder_parts`); in a bucket, where only names are listed, such a folder is refused.
    folder_markers: ClassVar[tuple[str, ...]] = ()

    # True: a shard can start reading only at the file's first row (the format yields no positions
    # and reads no range by an index of its own), so every shard reads the file from its start up to
    # its rows; the plan refuses shards that would so read a part many times over
    # (`shardinfer.input.staging`). The contract test holds every other format to a last shard that
    # reads less than the whole file.
    reads_from_start: ClassVar[bool] = False
    options_type: ClassVar[type[FormatOptions]] = FormatOptions
    # Input columns every output keeps (beside `input.keep_columns`): what a format's own output is
    # made of at gather (the OpenAI batch file's custom_id).
    always_kept: ClassVar[tuple[str, ...]] = ()
    tasks: ClassVar[tuple[str, ...] | None] = None  # the tasks that can read it (None: any)

    @property
    def options_section(self) -> str:
        """The input's key of this format's settings (`input.csv`): by default the format's name."""
        return self.name

    def options(self, inp: InputSettings) -> FormatOptions:
        """This format's settings for the input, as its options object."""
        return self.options_type(**inp.options)

    @contextmanager
    def reading(self, path: str) -> Iterator[None]:
        """Turn read errors into one line that names the file and this format."""
        try:
            yield
        except (pa.ArrowException, OSError, ValueError) as error:
            line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"input `{path}`: cannot read it as {self.name}: {line}") from error

    def folder_parts(self, folder: str, options: FormatOptions) -> tuple[str, ...] | None:
        """The parts of a folder laid out in this format's own way (a Hugging Face dataset), in row
        order; None for a folder that is not (its table files are then found by extension)."""
        return None

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        """The columns of the file `inp.path`, a name twice if it holds it twice (`fields`: the
        plan's types)."""
        raise NotImplementedError

    def fields(self, inp: InputSettings) -> pa.Schema | None:
        """The types that every part (`inp.files`) is read in, decided before the scan and recorded
        in the plan, so that all shards write one schema; None: each part as it is."""
        return None

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None
                ) -> Iterator[tuple[Position | None, pa.RecordBatch]]:
        """The read columns (`inp.read_columns`, duplicates kept) of the file `inp.path` in batches,
        all its rows or its span's, each with the position where a shard could start reading to
        get it (the same for the batches of one block; None: the format needs none, it reads any
        row range directly, or it `reads_from_start`)."""
        raise NotImplementedError

    def read_range(self, inp: InputSettings, start: int, end: int, span: Span | None = None,
                   fields: pa.Schema | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Rows [start, end) as (row number of the batch's first row, batch): by default from the
        span's position (or the start), the rows before `start` passed over."""
        if start >= end:
            return
        offset = span.row if span else 0
        if offset > start:
            raise ValueError(f"span starts at row {offset}, after the range's first row {start}")
        yield from rows_between((batch for _, batch in self.batches(inp, span, fields)), offset, start, end)

    def no_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> pa.RecordBatch:
        """The read columns (`inp.read_columns`) with no rows, in the types a read gives them: the
        columns of an input without rows, which no batch carries. By default in the plan's types
        (`fields`); a format whose files name their types without rows reads them from the file."""
        if fields is None:
            raise UserError(f"input `{inp.path}` has no rows, and a {self.name} file without rows names no column "
                            "types to write an empty table with")
        return empty_batch(fields, inp.read_columns)

    def column_types(self, inp: InputSettings, fields: pa.Schema | None = None) -> dict[str, pa.DataType]:
        """The read columns' types as a shard reads them (in the plan's types, `fields`)."""
        batch = self.no_rows(inp, fields)
        return dict(zip(batch.schema.names, batch.schema.types))

    def count_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> int:
        """The file's rows, as gather proves them (by default: read through)."""
        return sum(batch.num_rows for _, batch in self.batches(inp, None, fields))

    def rows_at_most(self, path: str, enough: int) -> tuple[int, bool] | None:
        """An upper bound on the file's rows, counted until it reaches `enough`, and whether it is
        exact; None where none is cheap to know."""
        return None

    def rows_read(self, path: str, held: Held) -> int:
        """Rows its shards would read of the file in place: by default exactly their ranges, or
        from the file's start to each range's end for a format that `reads_from_start`."""
        return sum(hi if self.reads_from_start else hi - lo for lo, hi in held)

    def stage(self, inp: InputSettings, path: str, held: Held, target: Path) -> tuple[str, tuple[str, ...] | None]:
        """Write a copy of the part that its shards can read by range to `target`; returns the
        copy's content digest and the columns it holds (None: all of the part's)."""
        raise NotImplementedError(f"{self.name} parts are never staged")

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        """Write `table` as a file (or folder) of this format at `path`, in blocks of about
        `block_rows` rows where the writer sets them (row groups, record batches, stripes; a text
        format's blocks are its reader's): the samples of tests/test_format_contract.py and of
        scripts/benchmarks/load_check.py, so that a new format is covered by adding its module."""
        raise NotImplementedError(f"{self.name} writes no sample")


def rows_between(batches: Iterator[pa.RecordBatch], offset: int, start: int, end: int
                 ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Rows [start, end) of consecutive batches whose first holds row `offset`, as (row number of
    the slice's first row, slice); stops reading at the batch that holds the last."""
    for batch in batches:
        lo, hi = max(start, offset), min(end, offset + batch.num_rows)
        if lo < hi:
            yield lo, batch.slice(lo - offset, hi - lo)
        offset += batch.num_rows
        if offset >= end:
            return


def conform(batch: pa.RecordBatch, fields: pa.Schema | None, columns: list[str]) -> pa.RecordBatch:
    """A batch in the plan's types over all parts: a widening, which holds every value exactly
    (`common_type`). By position: a kept text column is read twice under one name."""
    if fields is None:
        return batch
    types = [fields.field(column).type if column in fields.names else None for column in columns]
    if all(kind is None or kind == array.type for kind, array in zip(types, batch.columns)):
        return batch
    arrays = [array if kind is None else array.cast(kind) for kind, array in zip(types, batch.columns)]
    return pa.RecordBatch.from_arrays(arrays, names=columns)


def schema_types(schema: pa.Schema, fields: pa.Schema | None, columns: list[str]) -> dict[str, pa.DataType]:
    """`columns`' types in a file's `schema`, or in the plan's `fields` where they name one: a
    typed format's `column_types` without building a batch (Arrow builds none of a union)."""
    named = fields if fields is not None else pa.schema([])
    return {c: (named.field(c) if c in named.names else schema.field(c)).type for c in columns}


def empty_batch(schema: pa.Schema, columns: list[str]) -> pa.RecordBatch:
    """`columns` of `schema` (a name twice where asked for twice), without rows."""
    return select(pa.RecordBatch.from_pylist([], schema=schema), columns)


def select(batch: pa.RecordBatch | pa.Table, columns: list[str]) -> pa.RecordBatch:
    """The columns in order, a name twice where it is asked for twice."""
    if isinstance(batch, pa.Table):
        combined = batch.combine_chunks().to_batches()
        batch = combined[0] if batch.num_rows else pa.RecordBatch.from_pylist([], batch.schema)
    return pa.RecordBatch.from_arrays([batch.column(c) for c in columns], names=columns)


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


def widened_fields(inp: InputSettings, schema_of) -> pa.Schema | None:
    """The read columns' types over all parts of a typed format (Parquet, Arrow), from each part's
    schema (`schema_of(path)`) before anything is read: None when every part gives each column one
    type; else each column's type that holds every part's values exactly (`common_type`); a
    column no such type holds is refused. A column missing from a part is named by its scan."""
    found: dict[str, list[tuple[str, pa.DataType]]] = {}
    for path in inp.files:
        schema = schema_of(path)
        for column in inp.read_columns:
            if (i := schema.get_field_index(column)) >= 0:
                found.setdefault(column, []).append((path, schema.field(i).type))
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
