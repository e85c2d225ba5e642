"""The table as JSON Lines: `results/predictions.jsonl`, or with `output.layout: parts` the folder
`results/predictions-jsonl/` of parts (`part-00000-of-00003.jsonl`, ...; name order is index
order), each closed once it holds `output.part_size`.

One JSON object per row, its keys the table's columns in order (index, the keep columns, the
task's columns, `error` with row_errors: record), for any task. Values as JSON has them, and where
it has none: a list is an array, a struct an object, a map an array of [key, value] pairs; bytes
are base64 text (as JSON carries binary); a date, time or timestamp ISO 8601 text; a duration its
seconds; a decimal its exact text; NaN and infinities null (JSON has none: `json.loads` of Python's
`NaN` token fails in other readers). Floats are written exactly (a float32 as the double it is).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from shardinfer.output.base import (
    Destination,
    Proven,
    Writer,
    one_file_facts,
    open_text,
    size_of,
    staged,
    staged_folder,
    write_in_parts,
)

FILE = "predictions.jsonl"
FOLDER = "predictions-jsonl/"


class JSONL(Writer):
    """The table as JSON Lines: one JSON object per row, in index order."""

    name = "jsonl"
    writes = "the table as JSON Lines (an object per row): `predictions.jsonl`, or the folder `predictions-jsonl/`"

    def files(self, parts: bool) -> dict[str, str]:
        return {"jsonl_parts": FOLDER} if parts else {"jsonl": FILE}

    def write(self, proven: Proven, where: Destination) -> dict:
        if not where.parts:
            with staged([where.paths["jsonl"]]) as (tmp,), open_text(tmp) as out:
                for table in proven.tables:
                    out.writelines(lines(table))
            return one_file_facts(where.paths["jsonl"], rows=proven.rows)
        folder = where.paths["jsonl_parts"]
        with staged_folder(folder) as staging:
            count = write_in_parts(proven.tables, staging, where.part_bytes, ".jsonl", JsonlPart)
        return {"layout": "parts", "path": folder, "parts": count, "bytes": size_of(folder), "rows": proven.rows}

    def read_back(self, where: Destination) -> Iterator[dict]:
        files = sorted(Path(where.paths["jsonl_parts"]).glob("*.jsonl")) if where.parts else [where.paths["jsonl"]]
        for path in files:
            with open(path, encoding="utf-8") as lines_in:
                yield from map(json.loads, lines_in)


class JsonlPart:
    """A part of JSON Lines (`write_in_parts`)."""

    def __init__(self, path: Path) -> None:
        self.out = open_text(path)

    def write(self, table: pa.Table) -> None:
        self.out.writelines(lines(table))

    def size(self) -> int:
        return self.out.tell()

    def close(self) -> None:
        self.out.close()


def lines(table: pa.Table) -> Iterator[str]:
    """A row group's lines, in its rows' order."""
    columns = {name: column_values(table.column(name)) for name in table.column_names}
    for k in range(table.num_rows):
        yield json.dumps({name: values[k] for name, values in columns.items()}, ensure_ascii=False) + "\n"


def column_values(column: pa.ChunkedArray) -> list:
    """A column's values as JSON takes them (the module docstring): as they are where the type needs
    no change, else each value made plain."""
    values = column.to_pylist()
    return values if plain_already(column) else [plain(value) for value in values]


def plain_already(column: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a column's values go into JSON as Python gives them: no bytes, time, decimal or map
    anywhere in its type, and every float (at any depth) finite."""
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        return all(plain_already(pc.list_flatten(chunk)) for chunk in chunks)
    if pa.types.is_struct(kind):
        return all(plain_already(pc.struct_field(column, [k])) for k in range(kind.num_fields))
    if pa.types.is_floating(kind):
        return len(column) == column.null_count or bool(pc.all(pc.is_finite(column)).as_py())
    return not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)
                or pa.types.is_temporal(kind) or pa.types.is_decimal(kind) or pa.types.is_map(kind)
                or pa.types.is_dictionary(kind) and not plain_dictionary(kind))


def plain_dictionary(kind: pa.DictionaryType) -> bool:
    return pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)


def plain(value):
    """One value made plain for JSON (the module docstring)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


WRITERS = (JSONL(),)
