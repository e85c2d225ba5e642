"""Reading the input table as a stream of record batches, whole or one contiguous range.

Rows are numbered by their position in the file; that number is the `index` carried to the
output. Every reader yields only the requested columns and never holds the whole table.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from shardinfer.config import InputSettings
from shardinfer.errors import UserError

BLOCK_BYTES = 1 << 22
PARQUET_BATCH_ROWS = 8192
NULLS_LISTED = 5


@contextmanager
def reading(path: str, fmt: str) -> Iterator[None]:
    """Turn Arrow's read errors into one line that names the file and its format."""
    try:
        yield
    except (pa.ArrowException, OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"input `{path}`: cannot read it as {fmt}: {first_line}") from error


def _csv_batches(path: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """CSV has no types: read the columns as the strings they are ("02139" stays "02139")."""
    reader = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in columns}, include_columns=columns),
    )
    yield from reader


def _jsonl_blocks(path: str) -> Iterator[tuple[int, bytes]]:
    """The file (gzip too) in blocks of whole lines, each with the file's line number of its first
    line: Arrow's own blocks carry neither, so a row in block 3 could not be named in the file."""
    line, carry = 1, b""
    with pa.input_stream(path) as stream:  # decompresses by the file's extension
        while data := stream.read(BLOCK_BYTES):
            data = carry + data
            cut = data.rfind(b"\n") + 1
            block, carry = data[:cut], data[cut:]
            if block.strip():
                yield line, block
            line += block.count(b"\n")
    if carry.strip():
        yield line, carry


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


def _merge_fields(path: str, fields: pa.Schema, block: pa.Schema, first_line: int) -> pa.Schema:
    """Fields seen so far and a block's, one type each (int and float give float; null gives way)."""
    fields, block = _dates_as_text(fields, block), _dates_as_text(block, fields)
    try:
        return pa.unify_schemas([fields, block], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        for field in block:
            if field.name in fields.names and not _unifiable(fields.field(field.name), field):
                raise UserError(f"input `{path}`: column `{field.name}` holds {fields.field(field.name).type} "
                                f"before line {first_line} and {field.type} from there on; give it one type") from None
        raise


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
    for first_line, block in _jsonl_blocks(path):
        fields = _merge_fields(path, fields, _parse_jsonl(path, first_line, block).schema, first_line)
    return fields


def jsonl_fields(path: str) -> pa.Schema:
    """Every field of a JSONL file, each typed over all its rows (optional fields may first appear
    anywhere): one pass over the file, once per process and file version. Every reader then parses
    with these types, so each block, range and shard gets the same columns and types."""
    stat = os.stat(path)
    return _jsonl_fields_of(path, stat.st_size, stat.st_mtime_ns)


def _jsonl_batches(path: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    fields = jsonl_fields(path)
    schema = pa.schema([fields.field(c) for c in dict.fromkeys(columns)])
    for first_line, block in _jsonl_blocks(path):
        yield from _parse_jsonl(path, first_line, block, schema).to_batches()


def _parquet_batches(path: str, columns: list[str], row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    yield from pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=row_groups, columns=columns)


def column_names(inp: InputSettings) -> list[str]:
    """The input's columns, read from its schema (csv: its header; jsonl: every row's fields)."""
    with reading(inp.path, inp.format):
        if inp.format == "parquet":
            return pq.ParquetFile(inp.path).schema_arrow.names
        if inp.format == "csv":
            return pacsv.open_csv(inp.path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES)).schema.names
        return jsonl_fields(inp.path).names


def _select(batch: pa.RecordBatch, inp: InputSettings) -> pa.RecordBatch:
    columns = [inp.text_column, *inp.keep_columns]
    return pa.RecordBatch.from_arrays([batch.column(c) for c in columns], names=columns)


def iter_input(inp: InputSettings, row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """All rows (or the given parquet row groups) as batches of the text and keep columns."""
    columns = [inp.text_column, *inp.keep_columns]
    with reading(inp.path, inp.format):
        if inp.format == "parquet":
            batches = _parquet_batches(inp.path, columns, row_groups)
        elif inp.format == "csv":
            batches = _csv_batches(inp.path, columns)
        else:
            batches = _jsonl_batches(inp.path, columns)
        for batch in batches:
            yield _select(batch, inp)


def _parquet_groups_in_range(path: str, start: int, end: int) -> tuple[list[int], int]:
    """Row groups overlapping [start, end) and the global row number of the first one."""
    metadata = pq.ParquetFile(path).metadata
    groups, first_row, offset = [], None, 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        if offset < end and offset + rows > start:
            groups.append(group)
            first_row = offset if first_row is None else first_row
        offset += rows
    return groups, first_row or 0


def iter_range(inp: InputSettings, start: int, end: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Rows [start, end) as (global row number of the batch's first row, batch) pairs."""
    if start >= end:
        return
    row_groups, offset = None, 0
    if inp.format == "parquet":
        with reading(inp.path, inp.format):
            row_groups, offset = _parquet_groups_in_range(inp.path, start, end)
    for batch in iter_input(inp, row_groups):
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
    chars: np.ndarray  # characters of each row's text (0 for null), for the plan's cost estimate


def _check_columns(inp: InputSettings) -> None:
    """Each column the run reads is in the file once: a name twice (csv `id,text,id`, parquet too)
    would be read as one of them, silently; Arrow takes the first in csv and the last in parquet."""
    names = column_names(inp)
    for column in (inp.text_column, *inp.keep_columns):
        role = "text_column" if column == inp.text_column else "keep_columns"
        if column not in names:
            raise UserError(f"input.{role}: column `{column}` is not in `{inp.path}`; its columns are: {', '.join(names)}")
        if names.count(column) > 1:
            raise UserError(f"input.{role}: `{inp.path}` has {names.count(column)} columns named `{column}`; "
                            "rename them so that each name is one column")


def _check_text_type(inp: InputSettings, text: pa.Array) -> None:
    kind = text.type.value_type if pa.types.is_dictionary(text.type) else text.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise UserError(f"input.text_column `{inp.text_column}` holds {text.type}, not text (strings) in `{inp.path}`")


def scan_input(inp: InputSettings) -> InputScan:
    """Count the rows, measure and check every text value once, streaming; raises on anything unusable."""
    _check_columns(inp)
    rows, nulls, first_nulls, chars = 0, 0, [], []
    for batch in iter_input(dataclasses.replace(inp, keep_columns=())):  # the text is all it measures
        text = batch.column(0)
        if text.type != pa.null():
            _check_text_type(inp, text)
        chars.append(text_lengths(text))
        if text.null_count:
            positions = pc.indices_nonzero(text.is_null()).to_pylist()
            nulls += len(positions)
            first_nulls.extend(rows + p for p in positions[: NULLS_LISTED - len(first_nulls)])
        rows += batch.num_rows
    lengths = np.concatenate(chars) if chars else np.zeros(0, dtype=np.int32)
    return InputScan(rows=rows, null_texts=nulls, first_null_rows=tuple(first_nulls), chars=lengths)


def text_lengths(text: pa.Array) -> np.ndarray:
    """Characters per value (0 for null) as int32."""
    if text.type == pa.null():
        return np.zeros(len(text), dtype=np.int32)
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    if pa.types.is_string_view(text.type):
        text = text.cast(pa.string())
    return pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False).astype(np.int32)


def count_rows(inp: InputSettings) -> int:
    """The number of rows, from parquet metadata or by streaming through csv and jsonl."""
    if inp.format == "parquet":
        with reading(inp.path, inp.format):
            return pq.ParquetFile(inp.path).metadata.num_rows
    return sum(batch.num_rows for batch in iter_input(inp))


def text_values(text: pa.Array, null_as_empty: bool) -> list[str]:
    """Texts as Python strings; nulls become '' only where the config allows it."""
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    if text.null_count and null_as_empty:
        text = pc.fill_null(text.cast(pa.string()), "")
    return text.to_pylist()
