"""The writer interface: everything gather asks of an output writer, and nothing more.

Gather proves the shards first (`shardinfer.proof`), then hands every chosen writer (`output.writers`)
the same `Proven` rows: the table's row groups, in index order, each shard's values checked as they
pass (a shard whose values are not those its job wrote stops the stream, and no writer's file takes
its name). A writer writes them to the files it declares (`files`, the gather rule's outputs, under
the run's results folder) in the layout asked for (`output.layout`: one file, or a folder of parts),
and says what it wrote (`summary.json`'s `outputs`). A writer that cannot write a layout says so
(`parts`), and gather refuses it in one line when the Snakefile loads.

A writer is one module in this package defining `WRITERS` (a tuple of `Writer` instances; see
`shardinfer.output`); tests/test_writer_contract.py holds every registered one to the contract (the
Parquet table's rows, in order, in both layouts). Writers never import torch: gather runs anywhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol, TextIO

import pyarrow as pa

from shardinfer.core.atomic import atomic_path, partial_path, replace_folder
from shardinfer.plan.plan_file import Plan

PART_PREFIX = "part"


def part_width(count: int) -> int:
    """The digits of a part's number: at least five, more for 100,000 parts or more."""
    return max(5, len(str(count - 1)))


def part_name(number: int | str, count: int, suffix: str = ".parquet") -> str:
    """`part-00003-of-00012.parquet` (the Hugging Face layout: name order is index order); `number`
    may be a pattern's wildcard (`{shard}`)."""
    width = part_width(count)
    number = f"{number:0{width}d}" if isinstance(number, int) else number
    return f"{PART_PREFIX}-{number}-of-{count:0{width}d}{suffix}"


@dataclass(frozen=True)
class Proven:
    """What gather hands each writer once the proof holds. `tables`: the rows, a row group at a
    time in index order, to be taken once (a shard whose values fail their check raises inside it);
    `schema`: the table's columns with its identity (plan id, settings digest, rows) in its metadata;
    `place_parts`: the parts layout's folder made of the shards' own Parquet files with their
    manifest, returning what it wrote (the Parquet writer's parts: no value is read or written again)."""

    tables: Iterable[pa.Table]
    schema: pa.Schema | None  # None: shards known by their records only (parts in a bucket)
    plan: Plan
    digest: str
    model_path: str = ""
    place_parts: Callable[[str], dict] | None = None

    @property
    def rows(self) -> int:
        return self.plan.rows


@dataclass(frozen=True)
class Destination:
    """Where a writer writes: its files by the keys it declares (`Writer.files`), final paths, in the
    parts layout or not; `part_bytes`: where a writer that cuts its own parts starts the next one."""

    paths: Mapping[str, str]
    parts: bool = False
    part_bytes: int = 512 * 10**6


class Writer:
    """One output writer. Stateless: each is one instance, found by name (`output.writers`)."""

    name: ClassVar[str]  # what `output.writers` says
    writes: ClassVar[str]  # what it writes, in a few words (the docs' list of writers)
    parts: ClassVar[bool] = True  # it writes with `output.layout: parts` too
    formats: ClassVar[tuple[str, ...] | None] = None  # the input formats whose rows it can write (None: any)
    default_for: ClassVar[tuple[str, ...]] = ()  # input formats whose runs get it without output.writers

    def files(self, parts: bool) -> dict[str, str]:
        """Its files in the layout (`parts`): the gather rule's output name of each, and its path
        under the results folder (a folder's ends in `/`). The first is the one a user reads."""
        raise NotImplementedError

    def shown(self, parts: bool) -> str:
        """What a user reads, under the results folder: its first file (or its folder)."""
        return next(iter(self.files(parts).values()))

    def folder(self, parts: bool) -> str | None:
        """The folder it fills in the layout (ending in `/`), whose files the rule does not name one by
        one: the Parquet parts' folder, whose output is its manifest; None: none."""
        return None

    def reads_values(self, parts: bool) -> bool:
        """Whether it takes `Proven.tables` in the layout: the values, read from every shard file (not
        so the Parquet parts, which are the shards' own files)."""
        return True

    def write(self, proven: Proven, where: Destination) -> dict:
        """Write the proven rows to `where`, each file taking its final name only once every row is in
        it (`staged`), and return what it wrote for summary.json: `path` (the file or folder a user
        reads), `layout`, `parts` and `bytes`, and anything of its own."""
        raise NotImplementedError

    def read_back(self, where: Destination) -> Iterator[dict]:
        """Its rows as a reader gets them back from its files, in their order: each with `index` and
        the values it writes of the table's columns (tests/test_writer_contract.py holds them to the
        Parquet table's, so that a new writer is covered by adding its module)."""
        raise NotImplementedError

    def leaves(self, parts: bool) -> set[str]:
        """Every path it leaves under the results folder in the layout: its files and its folder."""
        return {*self.files(parts).values(), *filter(None, [self.folder(parts)])}


@contextmanager
def staged(paths: Iterable[str]) -> Iterator[list[Path]]:
    """A temporary file for each of `paths`; each takes its final name once the block ends without
    error, none otherwise."""
    with ExitStack() as stack:
        yield [stack.enter_context(atomic_path(path)) for path in paths]


@contextmanager
def staged_folder(path: str) -> Iterator[Path]:
    """An empty folder beside `path` (hidden), which replaces the folder `path` once the block ends
    without error."""
    target = Path(path.rstrip("/"))
    staging = partial_path(target)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_folder(staging, target)


def size_of(path: str | Path) -> int:
    """A file's bytes, or a folder's files' bytes."""
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def one_file_facts(path: str, **extra) -> dict:
    """What a writer of one file wrote, for summary.json."""
    return {"layout": "file", "path": path, "parts": 1, "bytes": os.path.getsize(path), **extra}


def open_text(path: Path) -> TextIO:
    return open(path, "w", encoding="utf-8")


class Part(Protocol):
    """One part file being written (`write_in_parts`): its row groups in order, and its bytes so far."""

    def write(self, table: pa.Table) -> None: ...

    def size(self) -> int: ...

    def close(self) -> None: ...


def write_in_parts(tables: Iterable[pa.Table], folder: Path, part_bytes: int, suffix: str,
                   start: Callable[[Path], Part]) -> int:
    """The rows in parts of about `part_bytes` (a part closes after the row group that fills it),
    each begun by `start(path)`, named `part-NNNNN-of-MMMMM<suffix>` once all are written (name order
    is index order); no rows is one empty part. Returns the parts."""
    written, part = [], None
    try:
        for table in tables:
            if part is None:
                written.append(folder / f"{len(written)}.partial")
                part = start(written[-1])
            part.write(table)
            if part.size() >= part_bytes:
                part.close()
                part = None
        if not written:
            written.append(folder / "0.partial")
            part = start(written[-1])
    finally:
        if part is not None:
            part.close()
    for number, path in enumerate(written):
        path.rename(folder / part_name(number, len(written), suffix))
    return len(written)
