"""The input's identity: a replaced or edited input is noticed whatever its mtime says.

Snakemake reruns a job when an input is *newer* than its output. `cp -p`, `rsync -a` and `tar x`
give a replaced input an *older* mtime, so on its own Snakemake would answer "Nothing to be done"
and keep the old table. Three layers close that gap, each as cheap as it can be, for every file
of the input (its parts: one for a single file, `shardinfer.input.discovery`):

1. The plan rule's params carry the parts' names, sizes and mtimes (`plan_trigger`). Snakemake
   reruns a job whose params changed, so a part added, removed or renamed, or any other size or
   mtime, older or newer, replans, and every shard after it reruns. Read from `os.stat` when the
   Snakefile loads: free.
2. The gather rule's params carry the parts' ctimes and inodes (`gather_trigger`). A file with the
   same size and mtime but another ctime was copied, moved, chmod-ed, or edited with its mtime put
   back; only its content tells which. Rerunning gather (seconds) lets the content digest decide;
   rerunning the plan would rerun every shard for a mere copy of the folder.
3. The plan records a SHA-256 of each part's bytes (`shardinfer.contract.file_digest`), computed
   alongside its scan (`digest_alongside`); gather recomputes it alongside its row count and
   refuses, in one line, a part whose content is no longer what was planned.

Both params are a digest of the parts' stats rather than the stats themselves, so that an input
of thousands of parts keeps Snakemake's job metadata small.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shardinfer.contract.file_digest import file_digest


def fingerprint(path: str) -> dict:
    """Size and modification time: cheap to recheck before every shard and at gather."""
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _stats_digest(paths: tuple[str, ...], keys: tuple[str, ...]) -> str:
    """A short digest of each file's name and the given `os.stat` fields, in order."""
    stats = [(path, *(getattr(os.stat(path), key) for key in keys)) for path in paths]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


def plan_trigger(paths: tuple[str, ...]) -> dict:
    """The parts' names, sizes and mtimes (ns): the plan rule's param, so that a part added, removed
    or renamed, or any other size or mtime (older too), replans."""
    return {"parts": len(paths), "size_mtime": _stats_digest(paths, ("st_size", "st_mtime_ns"))}


def gather_trigger(paths: tuple[str, ...]) -> dict:
    """The parts' ctimes (ns) and inodes: the gather rule's param, so that a replaced or rewritten part
    with the same size and mtime is checked again by content (a user cannot set ctime back; a copy
    gets a new one)."""
    return {"parts": len(paths), "ctime_inode": _stats_digest(paths, ("st_ctime_ns", "st_ino"))}


def storage_trigger(paths: tuple[str, ...]) -> dict:
    """The parts' names alone, for an input in a storage provider's bucket (no shared filesystem),
    which the Snakefile cannot stat: a part added, removed or renamed replans; a newer object replans
    by Snakemake's own mtime check (an upload's time is always new), and gather proves the content."""
    return {"parts": len(paths), "names": hashlib.sha256(json.dumps(list(paths)).encode()).hexdigest()[:16]}


class Background:
    """A digest computed in a thread while the caller reads the same file: hashlib and file reads
    release the GIL, so on two cores it costs almost no extra wall time, and the second reader
    finds the bytes in the page cache."""

    def __init__(self, path: str) -> None:
        self.stop, self.value, self.error = threading.Event(), None, None
        self.thread = threading.Thread(target=self._run, args=(path,), name="input digest", daemon=True)
        self.thread.start()

    def _run(self, path: str) -> None:
        try:
            self.value = file_digest(path, self.stop)
        except OSError as error:
            self.error = error

    def result(self) -> str:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


@contextmanager
def digest_alongside(path: str) -> Iterator[Background]:
    """`with digest_alongside(path) as digest: scan(...)`, then `digest.result()`. If the scan fails,
    the hashing stops at its next chunk instead of reading a large file to the end for nothing."""
    background = Background(path)
    try:
        yield background
    except BaseException:
        background.stop.set()
        raise
