"""The device loop: a window's batches through the engine (`Engine.run`), one batch in flight,
results back in the rows' order whatever their shape.

Batches are cut by cost (length-sorted, `shardinfer.hf.batching`) and their host inputs built ahead
in a worker. On the device thread a batch's results are collected only after the next batch is
queued, so the device has work while the host stores results. A batch that runs out of device
memory is halved and retried, down to a single row. With `row_errors.mode: record` (a `RowErrors`
passed in) any exception while predicting is narrowed down the same way: halves are retried until
each failing row stands alone, and its error is recorded instead of failing the shard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from shardinfer.core.errors import RowError, UserError
from shardinfer.engines.base import Engine
from shardinfer.settings.config import BatchSettings
from shardinfer.tasks.base import Window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A window ready for the device: its batches' row positions with host inputs built ahead."""

    window: Window
    keep: pa.Table  # the window's keep columns, written beside the results
    batches: list[tuple[np.ndarray, Any]]


def prepare_batches(engine: Engine, window: Window, keep: pa.Table, batch: BatchSettings) -> Prepared:
    planned = engine.batches(window, batch)
    return Prepared(window, keep, [(positions, engine.collate(window, positions)) for positions in planned])


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


@dataclass
class RowErrors:
    """`row_errors.mode: record`: a shard's failed rows (those of the window in flight by position),
    and the predict calls spent beyond the planned batches (isolating failures, halving on OOM)."""

    shard: int
    cap: int  # the most rows that may fail in the shard (row_errors.max)
    window: dict[int, str] = field(default_factory=dict)  # window position -> "Type: message"
    count: int = 0
    first_rows: list[int] = field(default_factory=list)
    first_error: str | None = None
    calls: int = 0
    planned: int = 0

    def record(self, row: int, position: int, message: str) -> None:
        self.window[position] = message
        self.count += 1
        self.first_rows = sorted([*self.first_rows, row])[:10]
        self.first_error = self.first_error or f"row {row}: {message}"
        log.warning("row %d failed and is recorded (row_errors: record): %s", row, message)
        if self.count > self.cap:
            raise UserError(f"shard {self.shard}: {self.count} rows failed, more than row_errors.max allows "
                            f"({self.cap}); first rows: {', '.join(map(str, self.first_rows))}; first error: "
                            f"{self.first_error:.300}")

    def take_window(self) -> dict[int, str]:
        window, self.window = self.window, {}
        return window

    def stats(self) -> dict:
        """The shard's row errors so far, and what a resumed job needs to go on counting (`resume`)."""
        return {"row_errors": self.count, "first_row_errors": self.first_rows,
                "row_error_calls": self.calls - self.planned, "first_row_error": self.first_error}

    def resume(self, stats: dict) -> None:
        """Go on from a resumed shard's kept windows (their `stats()`), so the cap covers the whole shard."""
        self.count, self.first_rows = stats["row_errors"], list(stats["first_row_errors"])
        self.calls, self.planned, self.first_error = stats["row_error_calls"], 0, stats["first_row_error"]


def describe(error: BaseException) -> str:
    """"Type: message" of the exception the task's code raised (a custom hook's, inside the task's
    one-line RowError): a string, so that no traceback keeps the failed batch alive."""
    cause = error.__cause__ if isinstance(error, RowError) and error.__cause__ is not None else error
    return f"{type(cause).__name__}: {cause}"


def is_row_error(error: BaseException) -> bool:
    """What record narrows down: any exception but the workflow's own refusals (a UserError that is
    not a RowError) and interrupts (BaseException, not Exception)."""
    return isinstance(error, Exception) and (isinstance(error, RowError) or not isinstance(error, UserError))


def predict_splitting(engine: Engine, window: Window, positions: np.ndarray, batch: Any, device: torch.device,
                      errors: RowErrors | None = None):
    """Yield (positions, CopyBack); a batch that runs out of device memory is halved and retried.

    Down to a single row: if that still does not fit, the job fails naming the row. With `errors`
    (record), any other exception splits the batch too, and a single row that fails is recorded.
    """
    failure = None
    try:
        if errors is not None:
            errors.calls += 1
        batch = batch if batch is not None else engine.collate(window, positions)
        outputs = engine.run(batch)
    except torch.OutOfMemoryError as error:
        outputs, failure = None, describe(error) if errors is not None else None
    except Exception as error:
        if errors is None or not is_row_error(error):
            raise
        outputs, failure = None, describe(error)
    if outputs is not None:
        yield positions, start_copy_back(outputs, device)
        return
    batch = None  # outside `except`, whose traceback would keep the failed batch alive
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if len(positions) == 1 and failure is not None:
        errors.record(window.first + int(positions[0]), int(positions[0]), failure)
        return
    unit = engine.task.cost.unit
    if len(positions) == 1:
        row, cost = window.first + int(positions[0]), int(window.costs[positions[0]])
        lower = "model.max_length" if unit == "tokens" else "what your code needs per row (model.options)"
        raise UserError(f"row {row} ({cost} {unit}) does not fit in device memory even alone; "
                        f"lower {lower} or use a device with more memory")
    log.warning("%s on a batch of %d rows (highest cost %d %s); splitting it in two",
                "out of memory" if failure is None else failure.split(":")[0], len(positions),
                int(window.costs[positions].max()), unit)
    half = len(positions) // 2
    yield from predict_splitting(engine, window, positions[:half], None, device, errors)
    yield from predict_splitting(engine, window, positions[half:], None, device, errors)


class Collected:
    """Per-batch results put back in row order: arrays of one shape are stacked, anything else
    (ragged arrays, strings, bytes) becomes a list with one value per row."""

    def __init__(self, rows: int, failed: tuple[int, ...] = ()) -> None:
        self.rows = rows
        self.failed = failed  # positions without results (row_errors: record)
        self.positions: list[np.ndarray] = []
        self.values: dict[str, list] = {}

    def add(self, positions: np.ndarray, outputs: dict[str, Any]) -> None:
        self.positions.append(np.asarray(positions))
        for name, values in outputs.items():
            if len(values) != len(positions):
                raise UserError(f"the task returned {len(values)} value(s) of `{name}` for a batch of "
                                f"{len(positions)} rows")
            self.values.setdefault(name, []).append(values)

    def in_row_order(self) -> dict[str, np.ndarray | list]:
        """The results of the rows that have them, in row order (all rows but the failed ones)."""
        order = np.concatenate(self.positions) if self.positions else np.zeros(0, dtype=np.int64)
        every = np.concatenate([order, np.asarray(self.failed, dtype=np.int64)])
        if len(every) != self.rows or len(np.unique(every)) != self.rows:
            raise UserError(f"the batches of a window of {self.rows} rows returned results for {len(order)}")
        inverse = np.argsort(order, kind="stable")
        return {name: _reorder(chunks, inverse) for name, chunks in self.values.items()}


def _reorder(chunks: list, inverse: np.ndarray) -> np.ndarray | list:
    arrays = all(isinstance(c, np.ndarray) and c.dtype != object for c in chunks)
    if arrays and len({c.shape[1:] for c in chunks}) == 1:
        return np.concatenate(chunks)[inverse]
    flat = [value for chunk in chunks for value in chunk]
    return [flat[i] for i in inverse]


def predict_window(engine: Engine, prepared: Prepared, device: torch.device,
                   errors: RowErrors | None = None) -> dict[str, np.ndarray | list]:
    """Run one window's batches on the device; results come back in the rows' order (with `errors`,
    those of the rows that did not fail; the failed ones are in `errors.window`)."""
    collected, in_flight = Collected(prepared.window.rows), None
    for planned, batch in prepared.batches:
        if errors is not None:
            errors.planned += 1
        for done in predict_splitting(engine, prepared.window, planned, batch, device, errors):
            if in_flight is not None:
                collected.add(in_flight[0], in_flight[1].ready())
            in_flight = done
    if in_flight is not None:
        collected.add(in_flight[0], in_flight[1].ready())
    collected.failed = tuple(errors.window) if errors is not None else ()
    return collected.in_row_order()
