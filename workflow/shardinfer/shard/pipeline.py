"""Stages in background threads joined by bounded queues, each timing its own work.

A shard job reads, tokenizes, batches and writes in workers while the main thread keeps the
device busy. Queues hold at most `depth` items, so memory stays flat however long the shard is.
Each stage counts the seconds it worked, not the seconds it waited on its neighbours, so the
slowest stage — the one that bounds the run — can be named in the log. A failure in any stage
stops the others and is raised in the main thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

_DONE = object()
_POLL_S = 0.1
NOT_YET = object()  # `Feed.take(wait=False)`: the next item is not ready


class Stopped(Exception):
    """Another stage failed; this one gives up quietly."""


@dataclass
class Stage:
    name: str
    busy_s: float = 0.0
    waited_s: float = 0.0  # on the stage before it (its input)


class Pipeline:
    """Usage: `source` → `map`… → consume with `drain` in the main thread → optional `sink`;
    leave the `with` block to join the workers and re-raise the first failure."""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth
        self.stages: list[Stage] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.sinks: dict[int, threading.Thread] = {}  # by id of the sink's inbox
        self.blocked_s = 0.0  # the main thread's waits in `put`, not counted as its stage's work

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if error is not None:
            self.stop.set()
        for thread in self.threads:
            thread.join()
        if error is None and self.errors:
            raise self.errors[0]

    def stage(self, name: str) -> Stage:
        self.stages.append(Stage(name))
        return self.stages[-1]

    def source(self, name: str, items: Iterable) -> queue.Queue:
        """Pull `items` in a worker; the time spent producing each one is the stage's work."""
        stage, outbox = self.stage(name), queue.Queue(self.depth)

        def work() -> None:
            iterator = iter(items)
            while True:
                started = time.perf_counter()
                item = next(iterator, _DONE)
                stage.busy_s += time.perf_counter() - started
                self._put(outbox, item)
                if item is _DONE:
                    return

        self._start(work)
        return outbox

    def map(self, name: str, function: Callable, inbox: queue.Queue) -> queue.Queue:
        """Apply `function` to each item in a worker."""
        stage, outbox = self.stage(name), queue.Queue(self.depth)

        def work() -> None:
            for item in self._items(inbox, stage):
                self._put(outbox, self._timed(stage, function, item))
            self._put(outbox, _DONE)

        self._start(work)
        return outbox

    def sink(self, name: str, function: Callable) -> queue.Queue:
        """A worker that calls `function` on each item put into the returned queue; `finish` ends it."""
        stage, inbox = self.stage(name), queue.Queue(self.depth)

        def work() -> None:
            for item in self._items(inbox, stage):
                self._timed(stage, function, item)

        self.sinks[id(inbox)] = self._start(work)
        return inbox

    def drain(self, name: str, inbox: queue.Queue) -> Iterator:
        """Items for the main thread; time between them counts as this stage's work."""
        stage = self.stage(name)
        try:
            for item in self._items(inbox, stage):
                started, blocked = time.perf_counter(), self.blocked_s
                yield item
                stage.busy_s += time.perf_counter() - started - (self.blocked_s - blocked)
        except Stopped:
            self._raise_failure()

    def feed(self, name: str, inbox: queue.Queue) -> Feed:
        """Items for the main thread that it takes when it wants, waiting or not (an engine that
        steps while the next window is still being prepared); see `Feed`."""
        return Feed(self, self.stage(name), inbox)

    def put(self, outbox: queue.Queue, item) -> None:
        """Hand an item from the main thread to a sink (waits while the sink is behind)."""
        started = time.perf_counter()
        try:
            self._put(outbox, item)
        except Stopped:
            self._raise_failure()
        finally:
            self.blocked_s += time.perf_counter() - started

    def finish(self, outbox: queue.Queue) -> None:
        """Tell a sink no more items come, and wait for it and every other stage to finish."""
        self.finish_sink(outbox)
        for thread in self.threads:
            thread.join()
        self._raise_failure()

    def finish_sink(self, outbox: queue.Queue) -> None:
        """Tell a sink no more items come and wait for it to finish those it has, while the stages
        before the main thread may still be running: a job that stops early keeps what it has done."""
        self.put(outbox, _DONE)
        self.sinks[id(outbox)].join()
        self._raise_failure()

    def bottleneck(self) -> Stage:
        return max(self.stages, key=lambda stage: stage.busy_s)

    def busy_seconds(self) -> dict[str, float]:
        """Each stage's work in seconds, by stage name: what the report stacks per shard."""
        return {stage.name: round(stage.busy_s, 3) for stage in self.stages}

    def report(self) -> str:
        """One line: each stage's work and wait in seconds, and the one that bounds the run."""
        parts = ", ".join(f"{s.name} {s.busy_s:.2f} s (waited {s.waited_s:.2f} s)" for s in self.stages)
        return f"stages: {parts}; bound by {self.bottleneck().name}"

    def _start(self, work: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                work()
            except Stopped:
                pass
            except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
                self.errors.append(error)
                self.stop.set()

        thread = threading.Thread(target=guarded, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def _raise_failure(self) -> None:
        if self.errors:
            raise self.errors[0]
        if self.stop.is_set():
            raise Stopped()

    def _items(self, inbox: queue.Queue, stage: Stage) -> Iterator:
        while True:
            started = time.perf_counter()
            item = self._get(inbox)
            stage.waited_s += time.perf_counter() - started
            if item is _DONE:
                return
            yield item

    @staticmethod
    def _timed(stage: Stage, function: Callable, item):
        started = time.perf_counter()
        try:
            return function(item)
        finally:
            stage.busy_s += time.perf_counter() - started

    def _get(self, inbox: queue.Queue):
        while True:
            try:
                return inbox.get(timeout=_POLL_S)
            except queue.Empty:
                if self.stop.is_set():
                    raise Stopped() from None

    def _put(self, outbox: queue.Queue, item) -> None:
        while not self.stop.is_set():
            try:
                outbox.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                pass
        raise Stopped()


class Feed:
    """The main thread's inbox, taken at its own pace: `take(wait=False)` answers NOT_YET when
    nothing is ready, so a loop that has other work (an engine to step) never blocks on the stage
    before it. Its stage's work is the main thread's time between `start` and `end` but for its
    waits here and in `Pipeline.put`."""

    def __init__(self, pipeline: Pipeline, stage: Stage, inbox: queue.Queue) -> None:
        self.pipeline, self.stage, self.inbox = pipeline, stage, inbox
        self.started, self.blocked, self.done = time.perf_counter(), pipeline.blocked_s, False

    def take(self, wait: bool):
        """The next item; None once every item was taken; NOT_YET when `wait` is false and none is ready."""
        if self.done:
            return None
        started = time.perf_counter()
        try:
            item = self.pipeline._get(self.inbox) if wait else self.inbox.get_nowait()
        except queue.Empty:
            if self.pipeline.stop.is_set():  # a stage failed: say so now, not once the engine is idle
                self.pipeline._raise_failure()
            return NOT_YET
        except Stopped:
            self.pipeline._raise_failure()
        finally:
            self.stage.waited_s += time.perf_counter() - started
        if item is _DONE:
            self.done = True
            return None
        return item

    def end(self) -> None:
        """Count the main thread's work since `started`."""
        spent = time.perf_counter() - self.started - (self.pipeline.blocked_s - self.blocked)
        self.stage.busy_s = max(0.0, spent - self.stage.waited_s)
