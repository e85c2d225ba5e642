"""The engine interface: read this first to add an engine.

An engine runs a task's rows on a model; the task (`shardinfer.tasks.base`) says what the rows
are (its input columns, how a window of them is prepared, its output columns), the engine how
they are run. A shard job loads one engine, which loads the model and the task around it, and
hands it the windows the task prepared:

    engine = Engine.load(task_class, context)   # once per job: the model, the task
    window = engine.task.prepare(first, table)  # the task's: a window of rows -> costs (+ data)
    for positions in engine.batches(window, batch):
        rows = engine.collate(window, positions)  # one call's rows, built on the host
        results = engine.run(rows)              # -> {name: per-row values}, in the rows' order
    columns = engine.task.to_arrow(results, index)

like vLLM's `LLM.generate`: a list of rows in, their results in order. An engine that `feeds`
takes the shard's windows as one stream instead (`feed`: vLLM's, kept full across windows), and
one with `own_batches` schedules a window's rows itself (`batches` gives the window whole).

Before any job, when the Snakefile loads, three classmethods that import no torch and no engine
library: `check_settings` (its one-line refusals), `devices` (the devices one engine spans: the
infer rule's GPUs; 0 for a server it does not start) and `identity` (what beside the settings
decides its outputs, such as its version: it enters the shard digest).

A task names the engines that serve it (`Task.engines`, its default first) and `<task>.engine`
picks one (`shardinfer.engines.engine_for`); an engine's own settings are the key of the task's
section named `options_key` (`generate.vllm`). The registry (`shardinfer.engines.ENGINES`) is the
one list of engine names: the schema's `engine` values and the docs' engine table follow it.
Engine modules import torch and their engine library inside their methods only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from shardinfer.core.errors import UserError
from shardinfer.settings.config import BatchSettings, Settings
from shardinfer.tasks.base import LoadContext, Task, Window

log = logging.getLogger(__name__)

NOT_YET = object()  # a window source's answer to `take(wait=False)` when the next window is not ready (`feed`)


class Engine:
    """What runs a task's rows. Subclasses set `name` and implement `load` and `run`."""

    name: ClassVar[str]
    # The key of the task's section that holds the engine's own settings (`generate.vllm`); None: it has none.
    options_key: ClassVar[str | None] = None
    # Whether it schedules a window's rows itself (vLLM: the window whole), so batch.max_tokens and
    # batch.max_rows do not apply and the shard log does not claim them.
    own_batches: ClassVar[bool] = False
    # Whether it takes the shard's windows as one stream (`feed`) rather than a batch at a time (`run`).
    feeds: ClassVar[bool] = False
    # The setting `devices` reads, named where too few devices are found for it ("" when none).
    devices_setting: ClassVar[str] = ""

    def __init__(self, task: Task) -> None:
        self.task = task

    @classmethod
    def load(cls, task_class: type[Task], context: LoadContext) -> Engine:
        """The model loaded for `task_class` on the context's device, and the task around it."""
        raise NotImplementedError

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """Its refusals of the settings, when the Snakefile loads (torch-free): each a one-line
        UserError naming the key, the value and what is allowed."""

    @classmethod
    def check_unused(cls, settings: Settings) -> None:
        """Its settings given while another engine runs the task: refused where they would mislead
        (vLLM's parallel sizes: that engine alone spreads a model over several GPUs)."""

    @classmethod
    def devices(cls, section: Mapping) -> int:
        """Devices one engine spans, from the task's config section (torch-free): the infer rule's
        `resources: gpu`, the lease's count, what `shards: auto` divides the GPUs by. One, unless
        it spreads a model over several (vLLM's tensor x pipeline parallel sizes), or 0 for a
        server the job does not start."""
        return 1

    @classmethod
    def identity(cls, settings: Settings) -> dict:
        """What beyond the settings decides its outputs (its build and version): in the shard digest
        when not empty. Torch-free: called when the Snakefile loads."""
        return {}

    def batches(self, window: Window, batch: BatchSettings) -> list[np.ndarray]:
        """The window's calls as row positions: the task's batches (sorted by cost under the budget)."""
        return self.task.batches(window, batch)

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        """Cost the calls pay, padding included."""
        return self.task.padded_tokens(window, batches)

    def collate(self, window: Window, positions: np.ndarray) -> Any:
        """One call's rows, built on the host ahead of the engine: the task's batch by default."""
        return self.task.collate(window, positions)

    def run(self, rows: Any) -> dict[str, Any]:
        """The rows' results, first axis = rows in the order given: tensors (left on the device; the
        runner copies them back after queuing the next call), arrays, or lists of any values. An
        engine that `feeds` runs them as a window of their own through `feed`, drained before it
        returns (`rows`: `collate`'s, with its rows' global `index`)."""
        if not self.feeds:
            raise NotImplementedError
        count = len(rows["index"])
        window = Window(int(rows["index"][0]) if count else 0, np.zeros(count, dtype=np.int64), None)
        items = iter([((), window, [(np.arange(count), rows)])])
        (_, results, _), = self.feed(lambda wait: next(items, None), False)
        return results

    def feed(self, take: Callable[[bool], Any], record: bool) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        """For an engine that `feeds`: the shard's windows as one stream. `take(wait)` gives the next
        (key, window, batches as `collate` built them), NOT_YET when none is ready and `wait` is
        false, None after the last. Yields per window, in order: (key, the results of its rows that
        did not fail, in row order, its failed rows: position -> "Type: message"); with `record`
        false a failed row fails the shard (a UserError naming it) instead."""
        raise NotImplementedError

    def finish(self) -> dict:
        """Stats for the shard's summary, called after each window: the task's (its `totals` among
        them), and the engine's own."""
        return self.task.finish()


def whole_window(batches: list, window: Window, engine: str) -> dict:
    """The one batch of an engine that takes a window whole (`collate` gave it all its rows)."""
    (positions, batch), = batches
    if len(positions) != window.rows:
        raise UserError(f"the {engine} engine takes a window whole; got a batch of {len(positions)} of "
                        f"{window.rows} rows")
    return batch


def failed_row(record: bool, row: int, why: str) -> str:
    """A row that failed alone, for a feeding engine: `why`, to record with `row_errors: record`;
    else the shard fails naming it."""
    if not record:
        raise UserError(f"row {row}: {why}; the shard's table was not written (fix the input, or "
                        "set row_errors.mode: record to write such rows as row errors)")
    return why


class EngineProgress:
    """A line in the shard log every `interval_s` while an engine that `feeds` works (each of its rows
    `advance`s it): the shard's own progress counts rows only once their window is written."""

    def __init__(self, interval_s: float = 30.0) -> None:
        self.interval_s, self.rows = interval_s, 0
        self.started = self.logged = time.perf_counter()

    def advance(self) -> None:
        self.rows += 1
        now = time.perf_counter()
        if now - self.logged >= self.interval_s:
            self.logged = now
            log.info("engine: %d rows done, %.1f rows/s", self.rows, self.rows / max(now - self.started, 1e-9))
