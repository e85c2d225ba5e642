"""Files that appear complete or not at all: write beside the target, fsync, then rename.

A job killed mid-write leaves only a `.<name>.partial` file, which no later step reads.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.errors import UserError

FULL = ("No space left on device", "Disk quota exceeded")  # as Arrow's IO errors say it, without an errno


def partial_path(path: Path) -> Path:
    return path.parent / f".{path.name}.partial"


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _commit(tmp: Path, path: Path) -> None:
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_folder(path.parent)


def no_space(error: BaseException) -> bool:
    """Whether an OS (or Arrow IO) error says the disk or the user's quota is full."""
    return isinstance(error, OSError) and (error.errno in (errno.ENOSPC, errno.EDQUOT)
                                           or any(text in str(error) for text in FULL))


@contextmanager
def naming_full_disk(path: str | Path) -> Iterator[None]:
    """A full disk while writing `path` is one line naming it, not a traceback without a path."""
    try:
        yield
    except OSError as error:
        if not no_space(error):
            raise
        raise UserError(f"no space left on the device while writing `{path}`; free space there (or move the "
                        "workflow's folder to a larger disk) and rerun: finished work is kept") from None


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(path)
    try:
        with naming_full_disk(path):
            yield tmp
            _commit(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_parquet_writer(path: str | Path, schema: pa.Schema, before_commit: Callable[[], None] | None = None,
                          **options) -> Iterator[pq.ParquetWriter]:
    """A ParquetWriter whose file only takes its final name once closed without error.

    `options`: ParquetWriter's own (compression, ...). `before_commit` runs after the file is closed
    (its footer written) and just before it takes its name: what must appear with the file (a
    shard's files folder) is renamed there, never earlier.

    Every page carries a CRC32 checksum, so a reader that asks for verification
    (`page_checksum_verification=True`) refuses a file damaged on disk instead of reading wrong values.
    """
    with atomic_path(path) as tmp:
        writer = pq.ParquetWriter(tmp, schema, write_page_checksum=True, **options)
        try:
            yield writer
        finally:
            writer.close()
        if before_commit is not None:
            before_commit()


def write_json_atomic(path: str | Path, data: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
