"""ORC (Apache ORC, as Hive, Spark and Trino write it): typed columns in stripes, with row counts
and types in the footer.

A stripe is ORC's block: the plan's scan marks where each one starts (the format's position,
`{"stripe": k}`), and a shard reads only the stripes from the one that holds its first row up to
the first one after its last, so all shards together read the file about once. Parts are typed
together from their schemas before anything is read, by exact widening only
(`base.widened_fields`). Read with pyarrow.orc, through plain reads: opened memory-mapped, its
reader brings the whole file into memory however few stripes it reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.orc as orc

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


@contextmanager
def opened(path: str) -> Iterator[orc.ORCFile]:
    """The file's reader, reading what it asks for alone (not memory-mapped: see the docstring)."""
    with pa.OSFile(path) as source:
        yield orc.ORCFile(source)


class Orc(Format):
    name = "orc"
    extensions = (".orc",)

    def _schema(self, path: str) -> pa.Schema:
        with self.reading(path), opened(path) as file:
            return file.schema

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        return self._schema(inp.path).names

    def fields(self, inp: InputSettings) -> pa.Schema | None:
        return widened_fields(inp, self._schema)

    def no_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> pa.RecordBatch:
        return conform(empty_batch(self._schema(inp.path), inp.read_columns), fields, inp.read_columns)

    def column_types(self, inp: InputSettings, fields: pa.Schema | None = None) -> dict[str, pa.DataType]:
        return schema_types(self._schema(inp.path), fields, inp.read_columns)

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None
                ) -> Iterator[tuple[Position, pa.RecordBatch]]:
        """A batch per stripe, from the span's first stripe to before its stop's."""
        columns = inp.read_columns
        with self.reading(inp.path), opened(inp.path) as file:
            first = span.at["stripe"] if span else 0
            stop = file.nstripes if span is None or span.stop is None else span.stop["stripe"]
            for stripe in range(first, stop):
                batch = file.read_stripe(stripe, columns=list(dict.fromkeys(columns)))
                yield {"stripe": stripe}, conform(select(batch, columns), fields, columns)

    def count_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> int:
        return self.rows_at_most(inp.path, 0)[0]

    def rows_at_most(self, path: str, enough: int) -> tuple[int, bool]:
        with self.reading(path), opened(path) as file:
            return file.nrows, True

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        """Stripes of about `block_rows` rows (ORC cuts them by bytes: the table's bytes per row)."""
        stripe_bytes = max(table.nbytes * block_rows // max(table.num_rows, 1), 1)
        orc.write_table(table, path, stripe_size=stripe_bytes, batch_size=min(block_rows, 1024))


FORMATS = (Orc(),)
