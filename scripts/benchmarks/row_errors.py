"""`scripts/benchmark.py --task row-errors`: what `row_errors: record` pays to isolate a failing
row, on the CPU with a toy task whose predict raises on chosen rows: extra predict calls and rows
predicted again per failed row, against the bound 2·log2(batch rows), for a few failure rates.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import numpy as np
import torch

from shardinfer.hf.batching import length_sorted_batches
from shardinfer.settings.config import BatchSettings
from shardinfer.tasks.traits import PlanCost


class FailingRows:
    """A toy task for `--task row-errors`: predict raises on a batch holding a chosen row."""

    cost = PlanCost(unit="rows")

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.calls, self.rows = failing, 0, 0

    def batches(self, window, batch: BatchSettings) -> list[np.ndarray]:
        return length_sorted_batches(window.costs, batch.max_tokens, batch.max_rows)

    def collate(self, window, positions: np.ndarray) -> np.ndarray:
        return window.first + np.asarray(positions)

    def predict(self, batch: np.ndarray) -> dict:
        self.calls, self.rows = self.calls + 1, self.rows + len(batch)
        if self.failing.intersection(batch.tolist()):
            raise ValueError("a failing row")
        return {"y": batch * 2}


def bench_row_errors(args: argparse.Namespace, work: Path) -> None:
    """Predict calls (and rows predicted) beyond the planned batches per failed row, with record."""
    from shardinfer.engines.transformers import Transformers
    from shardinfer.shard.device_loop import RowErrors, predict_window, prepare_batches
    from shardinfer.tasks.base import Window

    logging.getLogger("shardinfer.shard.device_loop").setLevel(logging.ERROR)  # a warning per failed row
    rows, batch_rows = args.rows or 16384, min(args.max_rows, 256)
    window = Window(0, np.ones(rows, dtype=np.int64), None)
    print(f"row_errors: record, {rows:,} rows in batches of {batch_rows}; bound 2·log2({batch_rows}) = "
          f"{2 * math.log2(batch_rows):.0f} extra calls per failed row")
    for rate in (0.0001, 0.001, 0.01):
        failing = set(np.random.default_rng(0).choice(rows, max(1, int(rows * rate)), replace=False).tolist())
        task, errors = FailingRows(failing), RowErrors(shard=0, cap=rows)
        prepared = prepare_batches(Transformers(task), window, None, BatchSettings(rows, batch_rows, rows))
        predict_window(Transformers(task), prepared, torch.device("cpu"), errors)
        extra, again = errors.stats()["row_error_calls"], task.rows - rows
        print(f"  {len(failing):>4} failed rows ({rate:.2%}): {len(prepared.batches)} planned calls + {extra} extra "
              f"= {extra / len(failing):.1f} extra calls and {again / len(failing):.0f} rows predicted again per "
              "failed row "
              f"({task.rows / rows:.2f}x the rows of a clean run)")
