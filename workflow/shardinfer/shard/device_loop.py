"""The device loop: a window's batches through the task, one batch in flight, results back in the
rows' order whatever their shape.

Batches are cut by cost (length-sorted, `shardinfer.shard.batching`) and their host inputs built ahead
in a worker. On the device thread a batch's results are collected only after the next batch is
queued, so the device has work while the host stores results. A batch that runs out of device
memory is halved and retried, down to a single row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from shardinfer.config import BatchSettings
from shardinfer.errors import UserError
from shardinfer.tasks.base import Task, Window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A window ready for the device: its batches' row positions with host inputs built ahead."""

    window: Window
    keep: pa.Table  # the window's keep columns, written beside the results
    batches: list[tuple[np.ndarray, Any]]


def prepare_batches(task: Task, window: Window, keep: pa.Table, batch: BatchSettings) -> Prepared:
    planned = task.batches(window, batch)
    return Prepared(window, keep, [(positions, task.collate(window, positions)) for positions in planned])


@dataclass(frozen=True)
class CopyBack:
    """A batch's outputs on their way to host memory; `ready` waits for them."""

    outputs: dict
    done: object = None  # a CUDA event recorded after the copies, or None when already on the host

    def ready(self) -> dict[str, Any]:
        if self.done is not None:
            self.done.synchronize()
        return {name: _to_numpy(v) if isinstance(v, torch.Tensor) else v for name, v in self.outputs.items()}


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor as an array; numpy has no bfloat16, so those become float32 (exact)."""
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def start_copy_back(outputs: dict, device: torch.device) -> CopyBack:
    """On a GPU, queue the tensors' copies into pinned host memory right behind the batch's own
    kernels, so that waiting for them later does not also wait for the batch queued after it.
    Values that are not tensors (lists, strings, bytes) are already on the host."""
    tensors = {name: v for name, v in outputs.items() if isinstance(v, torch.Tensor)}
    if device.type != "cuda" or not tensors:
        return CopyBack({name: v.cpu() if name in tensors else v for name, v in outputs.items()})
    host = dict(outputs)
    for name, values in tensors.items():
        host[name] = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host[name].copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return CopyBack(host, done)


def predict_splitting(task: Task, window: Window, positions: np.ndarray, batch: Any, device: torch.device):
    """Yield (positions, CopyBack); a batch that runs out of device memory is halved and retried.

    Down to a single row: if that still does not fit, the job fails naming the row.
    """
    try:
        batch = batch if batch is not None else task.collate(window, positions)
        outputs = task.predict(batch)
    except torch.OutOfMemoryError:
        outputs = None
    if outputs is not None:
        yield positions, start_copy_back(outputs, device)
        return
    batch = None  # outside `except`, whose traceback would keep the failed batch alive
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if len(positions) == 1:
        row, cost = window.first + int(positions[0]), int(window.costs[positions[0]])
        lower = "model.max_length" if task.cost_unit == "tokens" else "what your code needs per row (model.options)"
        raise UserError(f"row {row} ({cost} {task.cost_unit}) does not fit in device memory even alone; "
                        f"lower {lower} or use a device with more memory")
    log.warning("out of memory on a batch of %d rows (highest cost %d %s); splitting it in two", len(positions),
                int(window.costs[positions].max()), task.cost_unit)
    half = len(positions) // 2
    yield from predict_splitting(task, window, positions[:half], None, device)
    yield from predict_splitting(task, window, positions[half:], None, device)


class Collected:
    """Per-batch results put back in row order: arrays of one shape are stacked, anything else
    (ragged arrays, strings, bytes) becomes a list with one value per row."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.positions: list[np.ndarray] = []
        self.values: dict[str, list] = {}

    def add(self, positions: np.ndarray, outputs: dict[str, Any]) -> None:
        self.positions.append(np.asarray(positions))
        for name, values in outputs.items():
            if len(values) != len(positions):
                raise UserError(f"the task returned {len(values)} value(s) of `{name}` for a batch of {len(positions)} rows")
            self.values.setdefault(name, []).append(values)

    def in_row_order(self) -> dict[str, np.ndarray | list]:
        order = np.concatenate(self.positions) if self.positions else np.zeros(0, dtype=np.int64)
        if len(order) != self.rows or len(np.unique(order)) != self.rows:
            raise UserError(f"the batches of a window of {self.rows} rows returned results for {len(order)}")
        inverse = np.empty(self.rows, dtype=np.int64)
        inverse[order] = np.arange(self.rows)
        return {name: _reorder(chunks, inverse) for name, chunks in self.values.items()}


def _reorder(chunks: list, inverse: np.ndarray) -> np.ndarray | list:
    arrays = all(isinstance(c, np.ndarray) and c.dtype != object for c in chunks)
    if arrays and len({c.shape[1:] for c in chunks}) == 1:
        return np.concatenate(chunks)[inverse]
    flat = [value for chunk in chunks for value in chunk]
    return [flat[i] for i in inverse]


def predict_window(task: Task, prepared: Prepared, device: torch.device) -> dict[str, np.ndarray | list]:
    """Run one window's batches on the device; results come back in the rows' order."""
    collected = Collected(prepared.window.rows)
    in_flight = None
    for planned, batch in prepared.batches:
        for done in predict_splitting(task, prepared.window, planned, batch, device):
            if in_flight is not None:
                collected.add(in_flight[0], in_flight[1].ready())
            in_flight = done
    if in_flight is not None:
        collected.add(in_flight[0], in_flight[1].ready())
    return collected.in_row_order()
