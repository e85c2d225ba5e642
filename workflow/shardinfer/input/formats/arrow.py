"""Arrow IPC files (`.arrow`, `.feather`: Feather V2 is the IPC file format) and IPC streams.

Both are memory-mapped: a batch is a view of the file's pages, so a shard slices its rows out at
any row without copying or parsing what it skips, and no part is ever staged. A batch's position
is where a shard can start reading it: in an IPC *file* (magic `ARROW1`), whose footer lists its
batches, its number (`{"batch": k}`); in an IPC *stream* (what Hugging Face `datasets` writes),
which has no footer, the byte offset of its message (`{"byte": b}`), read from there on with the
stream's schema. So a shard reads only the batches that hold its rows (a stream with dictionary
columns, whose dictionaries come in messages of their own, is read from its start). Parts are
typed together from their schemas before anything is read, by exact widening only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.input.formats.base import (
    Format,
    Position,
    Span,
    conform,
    empty_batch,
    schema_types,
    select,
    widened_fields,
)
from shardinfer.settings.config import InputSettings

FILE_MAGIC = b"ARROW1"
FEATHER_V1_MAGIC = b"FEA1"
Batches = Iterator[tuple[Position | None, pa.RecordBatch]]


def _kind(path: str) -> str:
    """`file` or `stream`, by the first bytes; Feather V1 (deprecated by Arrow) is refused."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    if head.startswith(FEATHER_V1_MAGIC):
        raise UserError(f"input `{path}` is a Feather V1 file, which is not read; write it as Feather V2 "
                        "(pyarrow.feather.write_feather's default) or Parquet")
    return "file" if head == FILE_MAGIC else "stream"


def file_batches(source: pa.MemoryMappedFile, span: Span | None) -> Batches:
    """An IPC file's batches by number, from the span's to before its stop's, by the footer."""
    reader = pa.ipc.open_file(source)
    first = span.at["batch"] if span else 0
    stop = reader.num_record_batches if span is None or span.stop is None else span.stop["batch"]
    for k in range(first, stop):
        yield {"batch": k}, reader.get_batch(k)


def stream_batches(source: pa.MemoryMappedFile, span: Span | None) -> Batches:
    """An IPC stream's batches, each with its message's byte offset, from the span's on (after
    the schema, its first message) to before its stop's; from the start, without positions, when
    dictionaries come in messages of their own."""
    messages = pa.ipc.MessageReader.open_stream(source)
    schema = pa.ipc.read_schema(messages.read_next_message())
    if any(pa.types.is_dictionary(field.type) for field in schema):
        source.seek(0)
        yield from ((None, batch) for batch in pa.ipc.open_stream(source))
        return
    if span:
        source.seek(span.at["byte"])
        messages = pa.ipc.MessageReader.open_stream(source)
    stop = None if span is None or span.stop is None else span.stop["byte"]
    while stop is None or source.tell() < stop:
        offset = source.tell()
        try:
            message = messages.read_next_message()
        except StopIteration:
            return
        yield {"byte": offset}, pa.ipc.read_record_batch(message, schema)


class Arrow(Format):
    name = "arrow"
    extensions = (".arrow", ".feather", ".ipc")

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        return self._schema(inp.path).names

    def fields(self, inp: InputSettings) -> pa.Schema | None:
        return widened_fields(inp, self._schema)

    def _schema(self, path: str) -> pa.Schema:
        with self.reading(path), pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source) if _kind(path) == "file" else pa.ipc.open_stream(source)
            return reader.schema

    def no_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> pa.RecordBatch:
        return conform(empty_batch(self._schema(inp.path), inp.read_columns), fields, inp.read_columns)

    def column_types(self, inp: InputSettings, fields: pa.Schema | None = None) -> dict[str, pa.DataType]:
        return schema_types(self._schema(inp.path), fields, inp.read_columns)

    def raw_batches(self, path: str, span: Span | None = None) -> Batches:
        """The file's batches as written, each with its position (`file_batches`, `stream_batches`)."""
        with pa.memory_map(path) as source:
            yield from (file_batches if _kind(path) == "file" else stream_batches)(source, span)

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None) -> Batches:
        columns = inp.read_columns
        with self.reading(inp.path):
            for position, batch in self.raw_batches(inp.path, span):
                yield position, conform(select(batch, columns), fields, columns)

    def count_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> int:
        return self.rows_at_most(inp.path, 0)[0]

    def rows_at_most(self, path: str, enough: int) -> tuple[int, bool]:
        with self.reading(path):
            return sum(batch.num_rows for _, batch in self.raw_batches(path)), True

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        """An IPC file (Feather V2, uncompressed), a record batch per `block_rows` rows."""
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=block_rows)


FORMATS = (Arrow(),)
