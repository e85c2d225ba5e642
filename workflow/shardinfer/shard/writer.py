"""The write stage of a shard job: each window's results as a table of the shard file's columns
(its per-row files written first, a failed row's outputs null), committed as a window of its own
(`shardinfer.shard.resume`), and written to the shard's pieces, which hash the values as they pass, so
that gather can check them (`shardinfer.shard.pieces`, `shardinfer.contract.content_digest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from shardinfer.shard.pieces import ShardPieces
from shardinfer.shard.progress import Progress
from shardinfer.shard.resume import commit_window
from shardinfer.shard.row_files import ShardFiles
from shardinfer.shard.stats import Tally, WindowCost, running_totals
from shardinfer.tasks.base import Task


@dataclass
class Writer:
    """The write stage, a callable the pipeline's sink runs on each window in order."""

    writer: ShardPieces
    schema: pa.Schema
    task: Task
    files: ShardFiles | None
    windows: Path  # the shard's committed windows
    tally: Tally
    kept: Tally  # what the kept windows brought (a resumed shard)
    progress: Progress
    record: bool = False  # row_errors: record (an `error` column last)

    def __call__(self, item: Written) -> None:
        table = self.table(item)
        totals = running_totals(self.kept.task, item.task, self.task.reporting.totals)
        self.tally.add(table.num_rows, item.cost, item.row_errors, totals)
        if self.files is not None:
            self.files.sync()
        commit_window(self.windows, table, self.tally.to_json())
        self.writer.write_table(table)
        self.progress.advance(table.num_rows)

    def table(self, item: Written) -> pa.Table:
        keep, failed = item.keep, item.failed
        index = np.arange(item.first, item.first + keep.num_rows, dtype=np.int64)
        ok = np.ones(keep.num_rows, dtype=bool)
        ok[list(failed)] = False
        if not ok.any():  # every row of the window failed (row_errors: record)
            arrays = [pa.nulls(keep.num_rows, self.schema.field(name).type) for name in self.task.columns]
        else:
            arrays = self.outputs(item.results, index[ok])
            arrays = [with_nulls(array, ok) for array in arrays] if failed else arrays
        if self.record:  # row_errors: record: the `error` column
            arrays.append(pa.array([failed.get(k) for k in range(keep.num_rows)], pa.string()))
        return pa.Table.from_arrays([pa.array(index), *keep.columns, *arrays], schema=self.schema)

    def outputs(self, results: dict, index: np.ndarray) -> list:
        """The task's columns for the rows in `index` (those with results), file columns written."""
        arrays = self.task.to_arrow(results, index)
        for position, name in enumerate(self.task.columns):
            if name in (self.files.suffixes if self.files else {}):
                values = arrays[position]
                values = values.to_pylist() if isinstance(values, pa.Array) else list(values)
                arrays[position] = self.files.write(name, values, index)
        return arrays


@dataclass(frozen=True)
class Written:
    """What the device loop hands the writer for one window: not the window's inputs."""

    first: int
    keep: pa.Table
    results: dict
    failed: dict[int, str]
    cost: WindowCost
    row_errors: dict  # RowErrors.stats() after this window
    task: dict  # Task.finish() after this window


def with_nulls(values, ok: np.ndarray) -> pa.Array:
    """A column of the rows that succeeded, spread over all the window's rows: null where `ok` is not."""
    values = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    take = pa.array(np.cumsum(ok) - 1, mask=~ok)
    return values.take(take)
