"""Reading one input file as a stream of record batches, whole or one contiguous range.

Rows are numbered by their position in the file (an input of several files is read part by part
through `shardinfer.input.parts`, which numbers them across). Every reader yields only the requested
columns and never holds the whole table.

CSV and JSONL are read in blocks of whole records (BLOCK_BYTES each, cut by this module, not by
Arrow: a CSV value may hold a quoted newline). The plan's scan marks where each block starts
(row, line, byte); a shard then seeks to the last mark at or before its first row and stops at
the first mark after its last (`Span`), so all shards together read the file about once. A
compressed file cannot seek: read in place, a shard decompresses it from the start and drops
the bytes before its span (decompressing only; nothing before the span is parsed). Parquet shards
read only their row groups; inside one row group Arrow (26) offers no row range, so a shard
streams the group's pages from its start up to its last row. Where either would make the shards
read a part many times over, the plan stages a copy they can read by range (`shardinfer.input.staging`).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardinfer.config import InputSettings
from shardinfer.errors import UserError

BLOCK_BYTES = 1 << 20  # the parsing unit, and so how far before its rows a shard may start reading
PARQUET_BATCH_ROWS = 8192
NULLS_LISTED = 5
QUOTE, COMMA, LF, CR = (ord(c) for c in '",\n\r')


@dataclass(frozen=True)
class Mark:
    """Where a block of rows starts in a CSV or JSONL file: its first row, the file's line number
    there (JSONL errors name absolute lines) and its byte offset (decompressed, for .gz)."""
    row: int
    line: int
    byte: int


@dataclass(frozen=True)
class Span:
    """The part of a CSV or JSONL file that holds a shard's rows, from the plan: parsing starts at
    `at` (at or before the shard's first row) and reading stops at byte `stop` (a record boundary
    after its last row; None: the file's end). A JSONL span carries the fields typed over the
    whole file, so that no shard has to type them again by reading it all."""
    at: Mark
    stop: int | None
    fields: pa.Schema | None = None

    def to_json(self) -> dict:
        return {"row": self.at.row, "line": self.at.line, "byte": self.at.byte, "stop_byte": self.stop}

    @classmethod
    def from_json(cls, data: dict, fields: pa.Schema | None) -> Span:
        return cls(Mark(data["row"], data["line"], data["byte"]), data["stop_byte"], fields)


def fields_to_json(fields: pa.Schema) -> dict:
    """JSONL fields for the plan file: readable types, and the Arrow schema itself (IPC, base64)."""
    return {"types": {f.name: str(f.type) for f in fields},
            "arrow_schema": base64.b64encode(fields.serialize().to_pybytes()).decode()}


def fields_from_json(data: dict) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["arrow_schema"])))


@contextmanager
def reading(path: str, fmt: str) -> Iterator[None]:
    """Turn Arrow's read errors into one line that names the file and its format."""
    try:
        yield
    except (pa.ArrowException, OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"input `{path}`: cannot read it as {fmt}: {first_line}") from error


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".lz4", ".zst")  # what Arrow decompresses by the name (pa.input_stream)


def compressed(path: str) -> bool:
    """Whether Arrow reads the file through a decompressor (so it cannot seek), as its name says."""
    return path.endswith(COMPRESSED_SUFFIXES)


@contextmanager
def _opened_at(path: str, byte: int) -> Iterator[pa.NativeFile]:
    """The file from `byte` on. A compressed file (by its extension) cannot seek: it is decompressed
    from the start and the bytes before `byte` are dropped."""
    with pa.input_stream(path) as stream:
        if stream.seekable():
            stream.seek(byte)
        while not stream.seekable() and byte > 0 and (skipped := len(stream.read(min(byte, BLOCK_BYTES)))):
            byte -= skipped
        yield stream


def _blocks(path: str, cut: Callable[[bytes], int], at: Mark, stop: int | None,
            blank: bytes | None = None) -> Iterator[tuple[int, int, bytes]]:
    """The file from `at` to `stop` in blocks of whole records, each with its byte offset and line
    number; `cut(data)` says where the last whole record in `data` ends (0: none yet). Blocks of
    nothing but `blank` bytes (None: whitespace) are passed over: for CSV only line breaks, since
    Arrow reads a line of spaces as a row. A record longer than a block makes the next read as
    long as all that is pending, so that even a huge value is cut in linear time."""
    byte, line, carry = at.byte, at.line, b""
    left = float("inf") if stop is None else stop - at.byte
    with _opened_at(path, at.byte) as stream:
        while data := stream.read(min(max(BLOCK_BYTES, len(carry)), left)):
            left -= len(data)
            data = carry + data
            end = cut(data)
            block, carry = data[:end], data[end:]
            if block.strip(blank):
                yield byte, line, block
            byte, line = byte + len(block), line + block.count(b"\n")
    if carry.strip(blank):
        yield byte, line, carry


def _line_cut(data: bytes) -> int:
    return data.rfind(b"\n") + 1


def _csv_cut(data: bytes) -> int:
    return next(_record_ends(data), -1) + 1


def _record_ends(data: bytes) -> Iterator[int]:
    """The line breaks that end a CSV record in `data` (which starts at a record's start), from the
    last one backwards, found lazily: a line break inside a quoted value is part of the value."""
    opens, closes = _quoted_spans(np.frombuffer(data, np.uint8))
    end = len(data)
    while (end := _last_break(data, end)) >= 0:
        holder = int(np.searchsorted(opens, end)) - 1  # the quoted value that may hold this break
        if holder < 0 or end > closes[holder]:
            yield end
        else:
            end = int(opens[holder])


def _last_break(data: bytes, end: int) -> int:
    """The last line break before `end`: LF, or a CR not followed by LF (Arrow's three line ends).
    A CR that ends the data may be the first half of a CRLF: not a break yet."""
    lf = data.rfind(b"\n", 0, end)
    cr = data.rfind(b"\r", lf + 1, end)
    if cr == len(data) - 1:
        cr = data.rfind(b"\r", lf + 1, cr)
    return max(lf, cr)


def _quoted_spans(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where quoted values open and close (a value still open at the end closes at len(buf)), as
    Arrow's parser reads them: a quote opens one only at a value's start; inside, "" is a quote and
    any other quote closes it; elsewhere a quote is a character (12" pizza). When the quotes pair
    up as RFC 4180 writes them (nearly every file), they are simply taken two by two; a block where
    they do not is walked quote by quote."""
    quotes = np.flatnonzero(buf == QUOTE)
    before = buf[np.maximum(quotes - 1, 0)]
    at_start = (quotes == 0) | (before == COMMA) | (before == LF) | (before == CR)
    opens, closes = quotes[0::2], quotes[1::2]
    after = buf[np.minimum(closes + 1, len(buf) - 1)]  # a quote that ends the data reads itself: fine
    paired = (at_start[0::2] | (before[0::2] == QUOTE)).all() and np.isin(after, (COMMA, LF, CR, QUOTE)).all()
    if not paired:
        opens, closes = _walk_quotes(quotes, at_start)
    return opens, np.append(closes, len(buf))[: len(opens)]


def _walk_quotes(quotes: np.ndarray, at_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrow's quoting rules (see `_quoted_spans`), one quote at a time."""
    quotes, at_start = quotes.tolist(), at_start.tolist()
    opens, closes, inside, k = [], [], False, 0
    while k < len(quotes):
        if not inside:
            if at_start[k]:
                inside = True
                opens.append(quotes[k])
        elif k + 1 < len(quotes) and quotes[k + 1] == quotes[k] + 1:
            k += 1  # "" inside a quoted value: one quote character
        else:
            inside = False
            closes.append(quotes[k])
        k += 1
    return np.array(opens, dtype=np.int64), np.array(closes, dtype=np.int64)


def _csv_header(path: str) -> tuple[list[str], Mark]:
    """The header's column names and where the rows begin (a header may hold a quoted newline)."""
    data, end, size = b"", 0, 1 << 12  # every shard reads the header: a small read, doubled while it does not end
    with _opened_at(path, 0) as stream:
        while not end and (more := stream.read(size)):
            data, size = data + more, 2 * size
            end = min((e + 1 for e in _record_ends(data) if data[: e + 1].strip()), default=0)
    header = data[:end] if end else data
    options = pacsv.ParseOptions(newlines_in_values=True)
    names = pacsv.read_csv(pa.BufferReader(header), parse_options=options).column_names
    return names, Mark(0, 1 + header.count(b"\n"), len(header))


def _parse_csv(names: list[str], columns: list[str], block: bytes) -> pa.Table:
    """One block of records as a table. CSV has no types: the columns are read as the strings they
    are ("02139" stays "02139")."""
    return pacsv.read_csv(
        pa.BufferReader(block),
        read_options=pacsv.ReadOptions(column_names=names, block_size=len(block) + 1, use_threads=False),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in columns}, include_columns=columns),
    )


def _line_of_row(block: bytes, first_line: int, row: int) -> int:
    """The file's line number of a block's row: Arrow skips blank lines when it counts rows."""
    seen = -1
    for offset, text in enumerate(block.split(b"\n")):
        seen += bool(text.strip())
        if seen == row:
            return first_line + offset
    return first_line + block.count(b"\n")


def _parse_jsonl(path: str, first_line: int, block: bytes, schema: pa.Schema | None = None) -> pa.Table:
    """One block as a table: all fields typed from this block alone, or exactly `schema`'s
    (fields missing in a row are null, fields outside it ignored). Errors name the file's line."""
    parse = pajson.ParseOptions() if schema is None else pajson.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore")
    read = pajson.ReadOptions(block_size=len(block) + 1, use_threads=False)  # one block: rows count from its start
    try:
        return pajson.read_json(pa.BufferReader(block), read_options=read, parse_options=parse)
    except pa.ArrowInvalid as error:
        message = str(error).strip().splitlines()[0]
        row = re.search(r"\s*in row (\d+)$", message)
        line = _line_of_row(block, first_line, int(row.group(1))) if row else first_line
        message = message[: row.start()] if row else message
        raise UserError(f"input `{path}`: cannot read it as jsonl: line {line}: {message}") from error


class FieldConflict(Exception):
    """A field typed two ways that no one type holds (say numbers, then strings)."""

    def __init__(self, column: str, before: pa.DataType, after: pa.DataType) -> None:
        super().__init__(f"column `{column}` holds {before}, then {after}")
        self.column, self.before, self.after = column, before, after


def merge_fields(fields: pa.Schema, other: pa.Schema) -> pa.Schema:
    """Fields seen so far and more of them, one type each (int and float give float; null gives
    way); raises FieldConflict for a field that no one type holds."""
    fields, other = _dates_as_text(fields, other), _dates_as_text(other, fields)
    try:
        return pa.unify_schemas([fields, other], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        for field in other:
            if field.name in fields.names and not _unifiable(fields.field(field.name), field):
                raise FieldConflict(field.name, fields.field(field.name).type, field.type) from None
        raise


def _merge_fields(path: str, fields: pa.Schema, block: pa.Schema, first_line: int) -> pa.Schema:
    """A JSONL file's fields so far and a block's (see `merge_fields`); a conflict names the line."""
    try:
        return merge_fields(fields, block)
    except FieldConflict as conflict:
        raise UserError(f"input `{path}`: column `{conflict.column}` holds {conflict.before} before line "
                        f"{first_line} and {conflict.after} from there on; give it one type") from None


def _dates_as_text(fields: pa.Schema, other: pa.Schema) -> pa.Schema:
    """Arrow types a block's strings as timestamps when all of them look like dates; where another
    block holds other strings in that field, it is text."""
    def text_if_mixed(field: pa.Field) -> pa.Field:
        mixed = pa.types.is_timestamp(field.type) and field.name in other.names and pa.types.is_string(
            other.field(field.name).type)
        return field.with_type(pa.string()) if mixed else field

    return pa.schema([text_if_mixed(field) for field in fields])


def _unifiable(one: pa.Field, other: pa.Field) -> bool:
    try:
        pa.unify_schemas([pa.schema([one]), pa.schema([other])], promote_options="permissive")
        return True
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return False


@functools.lru_cache(maxsize=4)
def _jsonl_fields_of(path: str, size: int, mtime_ns: int) -> pa.Schema:
    fields = pa.schema([])
    for _, first_line, block in _blocks(path, _line_cut, Mark(0, 1, 0), None):
        fields = _merge_fields(path, fields, _parse_jsonl(path, first_line, block).schema, first_line)
    return fields


def jsonl_fields(path: str) -> pa.Schema:
    """Every field of a JSONL file, each typed over all its rows (optional fields may first appear
    anywhere): one pass over the file, once per process and file version. Every reader then parses
    with these types, so each block, range and shard gets the same columns and types. The plan
    records them, and a shard given its `Span` takes them from there instead."""
    stat = os.stat(path)
    return _jsonl_fields_of(path, stat.st_size, stat.st_mtime_ns)


BlockParser = Callable[[int, bytes], pa.Table]  # (the block's first line, its bytes) -> its rows
Reader = tuple[Callable[[bytes], int], BlockParser, Mark]  # how to cut blocks, parse them, where rows begin


def _csv_reader(path: str, columns: list[str]) -> Reader:
    """How to cut and parse a CSV file's blocks, and where its rows begin: after the header."""
    names, rows_begin = _csv_header(path)
    return _csv_cut, lambda line, block: _parse_csv(names, columns, block), rows_begin


def file_span(fmt: str, fields: pa.Schema | None) -> Span | None:
    """A span over a whole JSONL file read with the given fields (typed over every part of the
    input, not this file alone); None for CSV and Parquet, whose whole-file reads need none."""
    return Span(Mark(0, 1, 0), None, fields) if fmt == "jsonl" and fields is not None else None


def _jsonl_reader(path: str, columns: list[str], fields: pa.Schema | None) -> Reader:
    """How to cut and parse a JSONL file's blocks (with the whole file's types), and where its rows begin."""
    fields = jsonl_fields(path) if fields is None else fields
    schema = pa.schema([fields.field(c) for c in dict.fromkeys(columns)])
    return _line_cut, lambda line, block: _parse_jsonl(path, line, block, schema), Mark(0, 1, 0)


def _text_batches(inp: InputSettings, columns: list[str], span: Span | None) -> Iterator[tuple[Mark, pa.RecordBatch]]:
    """A CSV or JSONL file's rows (or its span's), as batches each with the mark of its block."""
    if inp.format == "csv":
        cut, parse, rows_begin = _csv_reader(inp.path, columns)
    else:
        cut, parse, rows_begin = _jsonl_reader(inp.path, columns, span and span.fields)
    at, stop = (span.at, span.stop) if span else (rows_begin, None)
    row = at.row
    for byte, line, block in _blocks(inp.path, cut, at, stop, b"\r\n" if inp.format == "csv" else None):
        mark = Mark(row, line, byte)
        for batch in parse(line, block).to_batches():
            yield mark, batch
            row += batch.num_rows


def parquet_batches(path: str, columns: list[str], row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """Pages streamed through a small buffer (no pre-buffering of whole column chunks): a shard that
    stops early in one huge row group has read the group only up to there, in bounded memory."""
    file = pq.ParquetFile(path, buffer_size=BLOCK_BYTES, pre_buffer=False)
    yield from file.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=row_groups, columns=columns)


def column_names(inp: InputSettings) -> list[str]:
    """The input's columns, read from its schema (csv: its header; jsonl: every row's fields)."""
    with reading(inp.path, inp.format):
        if inp.format == "parquet":
            return pq.ParquetFile(inp.path).schema_arrow.names
        if inp.format == "csv":
            return _csv_header(inp.path)[0]
        return jsonl_fields(inp.path).names


def _select(batch: pa.RecordBatch, inp: InputSettings) -> pa.RecordBatch:
    columns = inp.read_columns
    return pa.RecordBatch.from_arrays([batch.column(c) for c in columns], names=columns)


def _marked_batches(inp: InputSettings, row_groups: list[int] | None = None, span: Span | None = None
                    ) -> Iterator[tuple[Mark | None, pa.RecordBatch]]:
    """The read columns in batches, each with its CSV/JSONL block's mark (parquet: None)."""
    columns = inp.read_columns
    with reading(inp.path, inp.format):
        if inp.format == "parquet":
            marked = ((None, batch) for batch in parquet_batches(inp.path, columns, row_groups))
        else:
            marked = _text_batches(inp, columns, span)
        for mark, batch in marked:
            yield mark, _select(batch, inp)


def iter_input(inp: InputSettings, row_groups: list[int] | None = None, span: Span | None = None
               ) -> Iterator[pa.RecordBatch]:
    """All rows (or the given parquet row groups, or a CSV/JSONL span's rows) as batches of the
    task's and the keep columns."""
    for _, batch in _marked_batches(inp, row_groups, span):
        yield batch


def row_group_bounds(path: str) -> list[int]:
    """Where a Parquet file's row groups begin and the last one ends, from its footer: group k holds
    rows [bounds[k], bounds[k + 1])."""
    metadata = pq.ParquetFile(path).metadata
    bounds = [0]
    for group in range(metadata.num_row_groups):
        bounds.append(bounds[-1] + metadata.row_group(group).num_rows)
    return bounds


def _parquet_groups_in_range(path: str, start: int, end: int) -> tuple[list[int], int]:
    """Row groups overlapping [start, end) and the row number of the first one."""
    bounds = row_group_bounds(path)
    groups = [group for group in range(len(bounds) - 1) if bounds[group] < end and bounds[group + 1] > start]
    return groups, bounds[groups[0]] if groups else 0


def iter_range(inp: InputSettings, start: int, end: int, span: Span | None = None
               ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Rows [start, end) as (global row number of the batch's first row, batch) pairs. A CSV or
    JSONL file is read from the start unless the plan's `span` for the range is given."""
    if start >= end:
        return
    row_groups, offset = None, 0
    if inp.format == "parquet":
        with reading(inp.path, inp.format):
            row_groups, offset = _parquet_groups_in_range(inp.path, start, end)
    elif span is not None:
        if span.at.row > start:
            raise ValueError(f"span starts at row {span.at.row}, after the range's first row {start}")
        offset = span.at.row
    for batch in iter_input(inp, row_groups, span if inp.format != "parquet" else None):
        lo, hi = max(start, offset), min(end, offset + batch.num_rows)
        if lo < hi:
            yield lo, batch.slice(lo - offset, hi - lo)
        offset += batch.num_rows
        if offset >= end:
            return


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


@dataclass(frozen=True)
class InputScan:
    rows: int
    null_texts: int
    first_null_rows: tuple[int, ...]
    chars: np.ndarray  # characters of each row's text (0 for null, and for a custom task's rows), for the cost estimate
    marks: tuple[Mark, ...] = ()  # CSV/JSONL: where each block of rows starts, for shards to seek to
    fields: pa.Schema | None = None  # JSONL: every field, typed over the whole file

    def spans(self, ranges: list[tuple[int, int]]) -> tuple[Span | None, ...]:
        """Each range's span: from the last mark at or before its first row to the first mark at or
        after its end (the file's end when none), so a shard parses less than one block it does not
        need on either side. None for parquet (its row groups are its index)."""
        if not self.marks:
            return tuple(None for _ in ranges)
        rows = np.array([mark.row for mark in self.marks])
        firsts = np.searchsorted(rows, [start for start, _ in ranges], side="right") - 1
        afters = np.searchsorted(rows, [end for _, end in ranges], side="left")
        return tuple(Span(self.marks[max(int(first), 0)], self.marks[after].byte if after < len(rows) else None,
                          self.fields) for first, after in zip(firsts, afters))


def _check_columns(inp: InputSettings, fields: pa.Schema | None) -> None:
    """Each column the run reads is in the file once: a name twice (csv `id,text,id`, parquet too)
    would be read as one of them, silently; Arrow takes the first in csv and the last in parquet.
    JSONL: in `fields`, those of every part (a field only some parts carry is null in the others)."""
    names = column_names(inp) if fields is None else fields.names
    roles = [*zip(inp.task_columns, inp.column_keys), *((c, "input.keep_columns") for c in inp.keep_columns)]
    for column, role in roles:
        if column not in names:
            raise UserError(f"{role}: column `{column}` is not in `{inp.path}`; "
                            f"its columns are: {', '.join(names)}")
        if names.count(column) > 1:
            raise UserError(f"{role}: `{inp.path}` has {names.count(column)} columns named `{column}`; "
                            "rename them so that each name is one column")


def _check_text_type(inp: InputSettings, column: str, text: pa.Array) -> None:
    kind = text.type.value_type if pa.types.is_dictionary(text.type) else text.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        key = dict(zip(inp.task_columns, inp.column_keys)).get(column, "input.text_column")
        raise UserError(f"{key} `{column}` holds {text.type}, not text (strings) in `{inp.path}`")


class _TextMeasure:
    """Characters per row (summed over the task's text columns: the plan's cost) and the rows
    where any of them is null, batch by batch."""

    def __init__(self, inp: InputSettings) -> None:
        self.inp, self.chars, self.nulls, self.first_nulls = inp, [], 0, []

    def add(self, batch: pa.RecordBatch, first_row: int) -> None:
        chars, null = np.zeros(batch.num_rows, dtype=np.int32), np.zeros(batch.num_rows, dtype=bool)
        for column in self.inp.text_columns:
            text = batch.column(column)
            if text.type != pa.null():
                _check_text_type(self.inp, column, text)
            chars += text_lengths(text)
            if text.null_count:
                null |= text.is_null().to_numpy(zero_copy_only=False)
        self.chars.append(chars)
        if null.any():
            positions = np.flatnonzero(null)
            self.nulls += len(positions)
            self.first_nulls.extend(first_row + int(p) for p in positions[: NULLS_LISTED - len(self.first_nulls)])


def scan_input(inp: InputSettings, fields: pa.Schema | None = None) -> InputScan:
    """Count the rows, measure and check every text value once, streaming, and mark where each
    CSV/JSONL block starts; raises on anything unusable. Columns that are not text (a custom
    task's) are counted and read (so a bad value is found here), not measured (chars 0).
    `fields`: a JSONL part's fields typed over the whole input (default: this file's own)."""
    if inp.format == "jsonl" and fields is None:
        fields = jsonl_fields(inp.path)
    _check_columns(inp, fields)
    measure = _TextMeasure(inp) if inp.text_columns else None
    rows, marks = 0, []
    task_only = dataclasses.replace(inp, keep_columns=())  # the task's columns only
    for mark, batch in _marked_batches(task_only, span=file_span(inp.format, fields)):
        if mark is not None and (not marks or marks[-1] != mark):
            marks.append(mark)
        if measure:
            measure.add(batch, rows)
        rows += batch.num_rows
    chars = [np.zeros(rows, dtype=np.int32)] if measure is None else measure.chars
    return InputScan(rows=rows, null_texts=measure.nulls if measure else 0,
                     first_null_rows=tuple(measure.first_nulls) if measure else (),
                     chars=np.concatenate(chars) if chars else np.zeros(0, dtype=np.int32), marks=tuple(marks),
                     fields=fields)


def text_lengths(text: pa.Array) -> np.ndarray:
    """Characters per value (0 for null) as int32."""
    if text.type == pa.null():
        return np.zeros(len(text), dtype=np.int32)
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    if pa.types.is_string_view(text.type):
        text = text.cast(pa.string())
    return pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False).astype(np.int32)


def count_rows(inp: InputSettings, fields: pa.Schema | None = None) -> int:
    """The number of rows, from parquet metadata or by streaming through csv and jsonl (`fields`:
    a JSONL part's fields typed over the whole input, as the plan recorded them)."""
    if inp.format == "parquet":
        with reading(inp.path, inp.format):
            return pq.ParquetFile(inp.path).metadata.num_rows
    return sum(batch.num_rows for batch in iter_input(inp, span=file_span(inp.format, fields)))


def text_values(text: pa.Array, null_as_empty: bool) -> list[str]:
    """Texts as Python strings; nulls become '' only where the config allows it."""
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    if text.null_count and null_as_empty:
        text = pc.fill_null(text.cast(pa.string()), "")
    return text.to_pylist()
