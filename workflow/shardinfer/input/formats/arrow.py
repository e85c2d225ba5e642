"""Arrow IPC files (`.arrow`, `.feather`: Feather V2 is the IPC file format) and IPC streams.

Both are memory-mapped: a batch is a view of the file's pages, so a shard slices its rows out at
any row without copying or parsing what it skips, and no part is ever staged. The IPC *file*
format (magic `ARROW1`) has a footer that lists its batches: a shard reads only those that hold
its rows. An IPC *stream* (what Hugging Face `datasets` writes) has none: a shard walks the batch
headers up to its rows, which touches no data pages before them (uncompressed buffers). Parts
are typed together from their schemas before anything is read, by exact widening only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from shardinfer.config import InputSettings
from shardinfer.errors import UserError
from shardinfer.input.formats.base import Format, Mark, Span, conform, empty_batch, schema_types, select, widened_fields

FILE_MAGIC = b"ARROW1"
FEATHER_V1_MAGIC = b"FEA1"


def _kind(path: str) -> str:
    """`file` or `stream`, by the first bytes; Feather V1 (deprecated by Arrow) is refused."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    if head.startswith(FEATHER_V1_MAGIC):
        raise UserError(f"input `{path}` is a Feather V1 file, which is not read; write it as Feather V2 "
                        "(pyarrow.feather.write_feather's default) or Parquet")
    return "file" if head == FILE_MAGIC else "stream"


def _stream_batches(source: pa.MemoryMappedFile) -> Iterator[pa.RecordBatch]:
    yield from pa.ipc.open_stream(source)


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

    def _all_batches(self, path: str, first: int = 0) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(row of its first row, batch) for each batch that ends after row `first`."""
        with pa.memory_map(path) as source:
            if _kind(path) == "file":
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(k) for k in range(reader.num_record_batches))
            else:
                batches = _stream_batches(source)
            row = 0
            for batch in batches:
                if row + batch.num_rows > first:
                    yield row, batch
                row += batch.num_rows

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None
                ) -> Iterator[tuple[Mark | None, pa.RecordBatch]]:
        for _, batch in self.read_range(inp, 0, float("inf"), None, fields):
            yield None, batch

    def read_range(self, inp: InputSettings, start: int, end: float, span: Span | None = None,
                   fields: pa.Schema | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
        columns = inp.read_columns
        with self.reading(inp.path):
            for row, batch in self._all_batches(inp.path, start):
                if row >= end:
                    return
                lo, hi = max(start, row), min(end, row + batch.num_rows)
                if lo < hi:
                    yield lo, conform(select(batch.slice(lo - row, hi - lo), columns), fields, columns)

    def count_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> int:
        with self.reading(inp.path):
            return sum(batch.num_rows for _, batch in self._all_batches(inp.path))

    def rows_at_most(self, path: str, enough: int) -> tuple[int, bool]:
        with self.reading(path):
            return sum(batch.num_rows for _, batch in self._all_batches(path)), True


FORMATS = (Arrow(),)
