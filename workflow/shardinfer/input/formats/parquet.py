"""Parquet: typed columns in row groups, with row counts and types in the footer.

A shard reads only the row groups that hold its rows; inside one row group Arrow (26) offers no
row range (apache/arrow#45284), so a shard streams the group's pages from its start up to its last
row. Where a huge group holds the rows of many shards, the plan stages a copy with a row group
boundary at every shard boundary (`shardinfer.input.staging`). Parts are typed together from
their footers before anything is read, by exact widening only (`base.widened_fields`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.contract.file_digest import file_digest
from shardinfer.core.atomic import atomic_parquet_writer
from shardinfer.input.formats.base import (
    Format,
    Held,
    Span,
    conform,
    empty_batch,
    rows_between,
    schema_types,
    select,
    widened_fields,
)
from shardinfer.settings.config import InputSettings

BUFFER_BYTES = 1 << 20
BATCH_ROWS = 8192
GROUP_BYTES = 64 << 20  # a staged row group's Arrow size at most (memory while writing), inside one shard


def row_group_bounds(path: str) -> list[int]:
    """Where a Parquet file's row groups begin and the last one ends, from its footer: group k holds
    rows [bounds[k], bounds[k + 1])."""
    metadata = pq.ParquetFile(path).metadata
    bounds = [0]
    for group in range(metadata.num_row_groups):
        bounds.append(bounds[-1] + metadata.row_group(group).num_rows)
    return bounds


def parquet_batches(path: str, columns: list[str], row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
    """Pages streamed through a small buffer (no pre-buffering of whole column chunks): a shard that
    stops early in one huge row group has read the group only up to there, in bounded memory."""
    file = pq.ParquetFile(path, buffer_size=BUFFER_BYTES, pre_buffer=False)
    yield from file.iter_batches(batch_size=BATCH_ROWS, row_groups=row_groups, columns=columns)


class Parquet(Format):
    name = "parquet"
    extensions = (".parquet", ".pq")
    staged_suffix = ".parquet"

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        with self.reading(inp.path):
            return pq.ParquetFile(inp.path).schema_arrow.names

    def fields(self, inp: InputSettings) -> pa.Schema | None:
        return widened_fields(inp, self._schema)

    def _schema(self, path: str) -> pa.Schema:
        with self.reading(path):
            return pq.read_schema(path)

    def no_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> pa.RecordBatch:
        return conform(empty_batch(self._schema(inp.path), inp.read_columns), fields, inp.read_columns)

    def column_types(self, inp: InputSettings, fields: pa.Schema | None = None) -> dict[str, pa.DataType]:
        return schema_types(self._schema(inp.path), fields, inp.read_columns)

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None,
                row_groups: list[int] | None = None) -> Iterator[tuple[None, pa.RecordBatch]]:
        """No positions: a shard reads the row groups that hold its rows by the footer (`read_range`)."""
        columns = inp.read_columns
        with self.reading(inp.path):
            for batch in parquet_batches(inp.path, list(dict.fromkeys(columns)), row_groups):
                yield None, conform(select(batch, columns), fields, columns)

    def read_range(self, inp: InputSettings, start: int, end: int, span: Span | None = None,
                   fields: pa.Schema | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Only the row groups that overlap [start, end)."""
        if start >= end:
            return
        with self.reading(inp.path):
            bounds = row_group_bounds(inp.path)
        groups = [g for g in range(len(bounds) - 1) if bounds[g] < end and bounds[g + 1] > start]
        offset = bounds[groups[0]] if groups else 0
        yield from rows_between((batch for _, batch in self.batches(inp, None, fields, groups)), offset, start, end)

    def count_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> int:
        with self.reading(inp.path):
            return pq.ParquetFile(inp.path).metadata.num_rows

    def rows_at_most(self, path: str, enough: int) -> tuple[int, bool]:
        with self.reading(path):
            return pq.ParquetFile(path).metadata.num_rows, True

    def rows_read(self, path: str, held: Held) -> int:
        """From the start of the row group that holds a range's first row to the range's end."""
        with self.reading(path):
            bounds = row_group_bounds(path)
        return sum(hi - bounds[bisect.bisect_right(bounds, lo) - 1] for lo, hi in held)

    def stage(self, inp: InputSettings, path: str, held: Held, target: Path) -> tuple[str, tuple[str, ...]]:
        """The part's read columns rewritten into `target`, a row group ending at each shard's last
        row in it and after GROUP_BYTES (`_row_groups`); returns the copy's digest and its columns."""
        columns = list(dict.fromkeys(inp.read_columns))  # a kept text column is read twice, stored once
        with self.reading(path):
            schema = pq.ParquetFile(path).schema_arrow
        with atomic_parquet_writer(target, pa.schema([schema.field(c) for c in columns])) as writer:
            for group in _row_groups(self._read(path, columns), [hi for _, hi in held]):
                writer.write_table(group, row_group_size=group.num_rows)
        return file_digest(str(target)), tuple(columns)

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        pq.write_table(table, path, row_group_size=block_rows)

    def _read(self, path: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The part's batches, read faults named as the input's (the writer's pass through)."""
        with self.reading(path):
            yield from parquet_batches(path, columns)


def _row_groups(batches: Iterator[pa.RecordBatch], ends: list[int]) -> Iterator[pa.Table]:
    """The batches regrouped into tables that never cross one of `ends` (ascending), each ending
    too once it holds GROUP_BYTES (checked batch by batch: a table may pass it by one batch)."""
    pending, pending_bytes, row, cut = [], 0, 0, 0
    for batch in batches:
        while batch.num_rows:
            while cut < len(ends) and ends[cut] <= row:
                cut += 1
            take = min(batch.num_rows, ends[cut] - row) if cut < len(ends) else batch.num_rows
            pending.append(batch.slice(0, take))
            pending_bytes += pending[-1].nbytes
            batch, row = batch.slice(take), row + take
            if (cut < len(ends) and row == ends[cut]) or pending_bytes >= GROUP_BYTES:
                yield pa.Table.from_batches(pending)
                pending, pending_bytes = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


FORMATS = (Parquet(),)
