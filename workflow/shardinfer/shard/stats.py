"""A shard's stats: what its job counted of its rows (tokens real and padded, lengths, truncated
rows), of its task's own running totals (`Task.finish`), and of its work, recorded in the shard
file at close (`contract.shard_file.STATS_KEY`) and read by gather, the report and the terminal.

The shard's running totals are a `Tally`, committed with each window (`shardinfer.shard.resume`), so that
a resumed shard's stats cover all its rows, the kept windows' included; `resumed_*` says what those
brought, and this job's own work is the difference (what rates divide by:
`contract.shard_file.computed`). An empty shard's stats are an empty tally's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from shardinfer.tasks.base import Window

FIRST_ROWS = 10  # truncated rows a shard lists by row number, for the terminal's run-wide first ones


@dataclass(frozen=True)
class WindowCost:
    """A window's real and padded cost (tokens for text tasks), its rows per real length and its
    truncated rows: counted when its batches are cut, added to the tally when it is written."""

    real_tokens: int
    padded_tokens: int
    lengths: Counter
    truncated: list[int]  # the input's row numbers

    @classmethod
    def of(cls, window: Window, padded: int) -> WindowCost:
        real = window.real
        lengths, rows = np.unique(real, return_counts=True)  # not Counter(real.tolist()): a Python loop per row
        return cls(int(real.sum()), padded, Counter(dict(zip(lengths.tolist(), rows.tolist()))),
                   [window.first + i for i in window.truncated])


@dataclass
class Tally:
    """The shard's running totals after each written window."""

    rows: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    truncated_rows: list[int] = field(default_factory=list)
    lengths: Counter = field(default_factory=Counter)  # rows per real token length, for the report's histogram
    row_errors: dict = field(default_factory=dict)  # RowErrors.stats() after the window (row_errors: record)
    task: dict = field(default_factory=dict)  # Task.finish() after the window

    def add(self, rows: int, cost: WindowCost, row_errors: dict, task: dict) -> None:
        self.rows += rows
        self.real_tokens += cost.real_tokens
        self.padded_tokens += cost.padded_tokens
        self.lengths.update(cost.lengths)
        self.truncated += len(cost.truncated)
        self.truncated_rows = sorted([*self.truncated_rows, *cost.truncated])[:FIRST_ROWS]  # windows run sorted
        self.row_errors, self.task = row_errors, task

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "lengths": {str(n): k for n, k in sorted(self.lengths.items())}}

    @classmethod
    def from_json(cls, data: dict) -> Tally:
        return cls(**{**data, "lengths": Counter({int(n): k for n, k in data["lengths"].items()})})

    def stats(self, seconds: float, device: str, dtype: str | None, **work) -> dict:
        """The shard's stats: its rows and their totals (an empty shard's are an empty tally's),
        where and how long its job ran, then `work`: what else the job records (`work_stats`, its
        pipeline's stages, its span)."""
        return {"rows": self.rows, "seconds": round(seconds, 3), "device": device, "dtype": dtype,
                "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens, "truncated": self.truncated,
                "first_truncated_rows": self.truncated_rows,
                "token_lengths": {str(n): self.lengths[n] for n in sorted(self.lengths)}, **work}

    def work_stats(self, kept: Tally, task: dict, totals: Collection[str]) -> dict:
        """What a job that computed rows adds to its stats: its task's (`Task.finish()`: `task`), the
        running totals (`Reporting.totals`) summed with the kept windows', what the kept windows brought
        (`resumed_*`), the padding ratio and the row errors."""
        resumed = {f"resumed_{name}": value for name, value in kept.task.items() if name in totals}
        return {**running_totals(kept.task, task, totals), "resumed_rows": kept.rows,
                "resumed_real_tokens": kept.real_tokens, **resumed,
                "padding_ratio": round(self.padded_tokens / max(self.real_tokens, 1), 4), **self.row_errors}


def running_totals(kept: dict, now: dict, totals: Collection[str]) -> dict:
    """A task's stats (`Task.finish`) over a resumed shard's jobs: its running totals (`totals`,
    e.g. generated tokens) summed with the kept windows', its records by name (dicts: the image files
    read) merged with theirs; its other values describe this job."""
    records = {name: value for name, value in kept.items() if isinstance(value, dict)}
    return {**records, **{name: _running(kept.get(name), value, name in totals) for name, value in now.items()}}


def _running(kept, now, total: bool):
    if total and isinstance(kept, int):
        return now + kept
    if isinstance(now, dict) and isinstance(kept, dict):
        return {**kept, **now}
    return now
