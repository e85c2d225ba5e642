"""Files that appear complete or not at all: write beside the target, fsync, then rename.

Each attempt writes its own temporary file, `.<name>.<host>-<pid>.partial` (`attempt_path`): two
runs in one folder (after `snakemake --unlock`) never write into one file or rename it from under
each other. A job killed mid-write leaves only its temporary file, which no later step reads (gather
passes over hidden `.partial` names); the next attempt at the same file on that host removes those
of processes that are gone.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.core.errors import UserError

FULL = ("No space left on device", "Disk quota exceeded")  # as Arrow's IO errors say it, without an errno


PARTIAL = ".partial"  # what every temporary name ends with, hidden (a leading `.`) as well
HOST = socket.gethostname()


def partial_path(path: Path) -> Path:
    """A staging name beside `path` that every attempt shares (a shard's folder of files per row,
    which a rerun resumes from): hidden, ending in PARTIAL."""
    return path.parent / f".{path.name}{PARTIAL}"


def attempt_path(path: Path) -> Path:
    """This process's temporary file for `path` (an attempt is a process: one writer of a file each)."""
    return path.parent / f".{path.name}.{HOST}-{os.getpid()}{PARTIAL}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def remove_dead_attempts(path: Path) -> list[Path]:
    """Remove the temporary files of earlier attempts at `path` whose process on this host is gone
    (killed mid-write); another host's, or a running process's, are left, as gather leaves them."""
    prefix, removed = f".{path.name}.", []
    for entry in path.parent.iterdir() if path.parent.is_dir() else ():
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(PARTIAL)) or len(name) <= len(prefix) + len(PARTIAL):
            continue
        host, _, pid = name[len(prefix):-len(PARTIAL)].rpartition("-")
        if host == HOST and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                entry.unlink()
            except OSError:  # gone meanwhile (another attempt removed it), or not a file: left
                continue
            removed.append(entry)
    return removed


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
def atomic_path(path: str | Path, tidy: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path`, on error it is removed.
    `tidy=False`: the caller has already cleared the folder of earlier attempts (a shard's committed
    windows: `shardinfer.shard.resume`), so it is not listed again per file (hundreds of windows)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tidy:
        remove_dead_attempts(path)
    tmp = attempt_path(path)
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


def replace_folder(staging: Path, target: Path) -> None:
    """`staging` takes `target`'s name; the folder that had it is removed after."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    for entry in [*staging.iterdir(), staging]:
        if entry.is_file():
            with open(entry, "rb") as handle:
                os.fsync(handle.fileno())
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    fsync_folder(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: str | Path, data: dict) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
