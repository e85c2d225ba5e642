"""JSONL (JSON Lines, NDJSON): one JSON object per line, its fields typed by their values.

A field may first appear in any row, and a row may leave one out (it is null there). So a file's
fields are typed over all its rows in one pass, and over all parts for an input of several
(`fields`); the plan records them, every block and every shard is parsed in exactly those types,
and all shards write one schema. Errors name the file's line.
"""

from __future__ import annotations

import functools
import json
import os
import re

import pyarrow as pa
import pyarrow.json as pajson

from shardinfer.core.errors import UserError
from shardinfer.input.formats.text_blocks import Reader, TextFormat, blocks, line_cut, position
from shardinfer.settings.config import InputSettings

START = position(1, 0)


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


def _line_of_row(block: bytes, first_line: int, row: int) -> int:
    """The file's line number of a block's row: Arrow skips blank lines when it counts rows."""
    seen = -1
    for offset, text in enumerate(block.split(b"\n")):
        seen += bool(text.strip())
        if seen == row:
            return first_line + offset
    return first_line + block.count(b"\n")


def parse_block(path: str, first_line: int, block: bytes, schema: pa.Schema | None = None) -> pa.Table:
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


@functools.lru_cache(maxsize=4)
def _fields_of(path: str, size: int, mtime_ns: int) -> pa.Schema:
    fields = pa.schema([])
    for _, first_line, block in blocks(path, line_cut, START, None):
        try:
            fields = merge_fields(fields, parse_block(path, first_line, block).schema)
        except FieldConflict as conflict:
            raise UserError(f"input `{path}`: column `{conflict.column}` holds {conflict.before} before line "
                            f"{first_line} and {conflict.after} from there on; give it one type") from None
    return fields


def file_fields(path: str) -> pa.Schema:
    """Every field of a JSONL file, each typed over all its rows (optional fields may first appear
    anywhere): one pass over the file, once per process and file version."""
    stat = os.stat(path)
    return _fields_of(path, stat.st_size, stat.st_mtime_ns)


class Jsonl(TextFormat):
    name = "jsonl"
    extensions = (".jsonl", ".ndjson")

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        if fields is not None:
            return fields.names
        with self.reading(inp.path):
            return file_fields(inp.path).names

    def fields(self, inp: InputSettings) -> pa.Schema:
        """Every field of every part, one type each, as the rows of one file are typed."""
        fields = pa.schema([])
        for path in inp.files:
            try:
                with self.reading(path):
                    fields = merge_fields(fields, file_fields(path))
            except FieldConflict as conflict:
                raise UserError(f"input `{path}`: column `{conflict.column}` holds {conflict.after} here and "
                                f"{conflict.before} in the parts before it; give it one type") from None
        return fields

    def reader(self, inp: InputSettings, fields: pa.Schema | None) -> Reader:
        fields = file_fields(inp.path) if fields is None else fields
        schema = pa.schema([fields.field(c) for c in dict.fromkeys(inp.read_columns)])
        return line_cut, lambda line, block: parse_block(inp.path, line, block, schema), START

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        """One JSON object per row (`json.dumps` of its values: a sample, not a fast writer)."""
        with open(path, "w", encoding="utf-8") as sink:
            for batch in table.to_batches(max_chunksize=max(block_rows, 1)):
                sink.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in batch.to_pylist())


FORMATS = (Jsonl(),)
