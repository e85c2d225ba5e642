"""Every chosen writer over one read of the proven rows.

The writers that take the values (`Writer.reads_values`) each run in a thread of their own, on an
iterator of their own, fed the same row groups by one reader: the shards' values are read (and a
changed shard's checked) once however many files are written from them, and memory holds a few row
groups. A failure anywhere ends them all: a shard refused by the proof is raised inside every
writer's iterator, so that none of their files takes its name, and a writer's own error stops the
reading. The writers that take no value (the Parquet parts, the shards' own files) run after, once
the values passed.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TypeVar

import pyarrow as pa

from shardinfer.output.base import Destination, Proven, Writer

T = TypeVar("T")
DONE = object()


class Stopped(Exception):
    """Raised inside a writer's iterator when the reading stopped: the proof or another writer failed."""


def write_all(writers: list[Writer], proven: Proven, where: dict[str, Destination]) -> dict[str, dict]:
    """Each writer's facts (`Writer.write`), by name, in the writers' order."""
    readers = [writer for writer in writers if writer.reads_values(where[writer.name].parts)]
    takers = [functools.partial(take, writer, proven, where[writer.name]) for writer in readers]
    facts = dict(zip((w.name for w in readers), fan_out(proven.tables, takers)))
    for writer in writers:
        if writer.name not in facts:
            facts[writer.name] = writer.write(replace(proven, tables=()), where[writer.name])
    return {writer.name: facts[writer.name] for writer in writers}


def take(writer: Writer, proven: Proven, where: Destination, tables: Iterator[pa.Table]) -> dict:
    """`writer` writing `tables`, its own iterator of the proven rows."""
    return writer.write(replace(proven, tables=tables), where)


def fan_out(tables: Iterable[pa.Table], takers: list[Callable[[Iterator[pa.Table]], T]], depth: int = 2) -> list[T]:
    """Each taker's result, each given every table of `tables`, in order, on an iterator of its own in
    a thread of its own (one taker: on `tables` itself, here); `tables` is read once, up to `depth`
    ahead of the slowest taker. The first error, of the reading or of a taker, is raised here."""
    if len(takers) <= 1:
        return [taker(iter(tables)) for taker in takers]
    stop = threading.Event()
    feeds = [queue.Queue(maxsize=depth) for _ in takers]
    done = [threading.Event() for _ in takers]  # a taker that returned takes no more
    results: list = [None] * len(takers)
    errors: list[BaseException | None] = [None] * len(takers)

    def run(k: int) -> None:
        try:
            results[k] = takers[k](taken(feeds[k], stop))
        except BaseException as error:  # handed to the reader, who raises it
            errors[k] = error
            stop.set()
        finally:
            done[k].set()

    threads = [threading.Thread(target=run, args=(k,), name=f"writer {k}", daemon=True) for k in range(len(takers))]
    for thread in threads:
        thread.start()
    try:
        for table in tables:
            if not all([offer(feed, table, stop, gone) for feed, gone in zip(feeds, done)]):
                break
        else:
            for feed, gone in zip(feeds, done):
                offer(feed, DONE, stop, gone)
    except BaseException:
        stop.set()
        raise
    finally:
        for thread in threads:
            thread.join()
    first = next((error for error in errors if error is not None and not isinstance(error, Stopped)), None)
    if first is not None:
        raise first
    return results


def offer(feed: queue.Queue, item: object, stop: threading.Event, gone: threading.Event) -> bool:
    """Put `item` for a taker (passed over once it returned); False once the reading stopped."""
    while not stop.is_set():
        if gone.is_set():
            return True
        try:
            feed.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def taken(feed: queue.Queue, stop: threading.Event) -> Iterator[pa.Table]:
    """A taker's tables, until the reader says they are done; `Stopped` once the reading stopped."""
    while True:
        try:
            item = feed.get(timeout=0.1)
        except queue.Empty:
            if stop.is_set():
                raise Stopped("the rows stopped before their end") from None
            continue
        if item is DONE:
            return
        yield item
