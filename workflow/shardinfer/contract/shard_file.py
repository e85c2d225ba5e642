"""The shard-file contract: what a shard file holds and says about itself.

Written by the infer rule, read by gather (and, for the index column, by the tokenize rule's
files): an `index` column with each row's global number, the keep columns, then the task's
output columns. Its metadata carries the identity it was made under (plan, range, settings
digest, task, where its files are) under IDENTITY_KEY, fixed before the first row is written,
and the job's stats under STATS_KEY, added at close.

A task declares each output column by an Arrow type (any: structs, lists of structs), or by a type
string, the words a user's own code uses: "float32", "int64", "string", "binary",
"list<float32>", "struct<start: int32, label: string>", ..., or "file:.png" for a file per row
that the runner writes (never the task) and the table describes by path, byte size and SHA-256
(FILE_TYPE).
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

INDEX_COLUMN = "index"
ERROR_COLUMN = "error"  # row_errors: record: a failed row's exception ("Type: message"), null for the others
IDENTITY_KEY = b"shardinfer"  # the plan, range and settings the file was made under
STATS_KEY = b"shardinfer.stats"  # rows, time, device, tokens
# Among the stats: the image files the job read by path, {name: {row, size, mtime_ns, ctime_ns, sha256}}
# (`shardinfer.input.image_files`), which gather proves unchanged; not in the run's summary.
IMAGES_READ = "images_read"
FILE_PREFIX = "file:"
FILE_TYPE = pa.struct([("path", pa.string()), ("size", pa.int64()), ("sha256", pa.string())])
FILE_DIGITS = 9  # files are named by global row index, zero padded: results/files/3/000001234.png
SCALAR_TYPES = {
    "bool": pa.bool_(), "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64(),
    "string": pa.string(), "binary": pa.binary(),
}
TYPE_WORDS = f"{', '.join(SCALAR_TYPES)}, list<T> and struct<name: T, ...> of those, or file:.<ext>"
OutputType = str | pa.DataType  # a declared output column's type: an Arrow type, or its words


def file_suffix(spec: OutputType) -> str | None:
    """".png" for "file:.png"; None for a column that is not a file."""
    return spec[len(FILE_PREFIX):] if isinstance(spec, str) and spec.startswith(FILE_PREFIX) else None


def arrow_type(spec: OutputType) -> pa.DataType:
    """The Arrow type of a declared output type; ValueError naming what is allowed."""
    if isinstance(spec, pa.DataType):
        return spec
    spec = spec.strip()
    suffix = file_suffix(spec)
    if suffix is not None:
        if not re.fullmatch(r"\.[A-Za-z0-9][A-Za-z0-9._-]{0,15}", suffix):
            raise ValueError(f"file type {spec!r} needs an extension such as file:.png")
        return FILE_TYPE
    inner = re.fullmatch(r"list<(.+)>", spec)
    if inner:
        return pa.list_(arrow_type(inner.group(1)))
    inner = re.fullmatch(r"struct<(.+)>", spec)
    if inner:
        return pa.struct([struct_field(part) for part in top_level_parts(inner.group(1))])
    if spec not in SCALAR_TYPES:
        raise ValueError(f"unknown type {spec!r}; allowed: {TYPE_WORDS}")
    return SCALAR_TYPES[spec]


def top_level_parts(text: str) -> list[str]:
    """`a: int32, b: list<string>` split at the commas outside any `<...>`."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(text):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    return [*parts, text[start:]]


def struct_field(text: str) -> pa.Field:
    """`name: type`, a struct's field."""
    name, colon, kind = text.partition(":")
    if not colon or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()):
        raise ValueError(f"struct field {text.strip()!r} must be `name: type`; allowed types: {TYPE_WORDS}")
    if file_suffix(kind.strip()) is not None:
        raise ValueError(f"struct field {text.strip()!r}: a file is a column of its own, not a struct's field")
    return pa.field(name.strip(), arrow_type(kind))


def shard_schema(outputs: dict[str, OutputType], keep: pa.Schema, identity: dict, errors: bool = False) -> pa.Schema:
    """index, the keep columns, then the task's outputs (then `error`, with row_errors: record), with
    the identity in the metadata."""
    fields = [pa.field(INDEX_COLUMN, pa.int64()), *keep,
              *(pa.field(name, arrow_type(spec)) for name, spec in outputs.items()),
              *([pa.field(ERROR_COLUMN, pa.string())] if errors else [])]
    return pa.schema(fields, metadata={IDENTITY_KEY: json.dumps(identity).encode()})


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth dictionary-encoding when a shard (or the table made of shards) is written:
    all but floats and lists of floats, whose values rarely repeat. Parquet writers try a dictionary
    for every column and fall back when it grows too large; for wide float rows that try is a large
    share of the writing time (scripts/benchmarks/scale.py)."""
    def floats(kind: pa.DataType) -> bool:
        while pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            kind = kind.value_type
        return pa.types.is_floating(kind)

    return [field.name for field in schema if not floats(field.type)]


def file_columns(outputs: dict[str, OutputType]) -> dict[str, str]:
    """The output columns that are files, with their extensions."""
    return {name: file_suffix(spec) for name, spec in outputs.items() if file_suffix(spec) is not None}


def file_name(index: int, suffix: str) -> str:
    return f"{index:0{FILE_DIGITS}d}{suffix}"


def computed(stats: dict, name: str) -> int:
    """A shard's `name` (rows, real_tokens, generated_tokens) computed by the job that finished it:
    its total less what committed windows of a stopped earlier job brought (`resumed_<name>`), the
    figure a rate divides by the job's seconds."""
    return (stats.get(name) or 0) - (stats.get(f"resumed_{name}") or 0)
