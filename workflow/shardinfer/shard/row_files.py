"""Files per row (an image per input row): written by the runner, never by the task's code, and
proven at gather like the rows (the names and the proof: `shardinfer.contract.row_files`).

A shard's files go into its staging folder (`results/files/.3.partial`), which takes its final
name only once the shard's table is complete and closed, just before the table takes its own: a
failed job leaves neither (only the staging folder, whose files its committed windows may name:
`shardinfer.shard.resume`), and a job killed between the two renames leaves a folder without its
table, which Snakemake reruns as incomplete and gather refuses.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from shardinfer.contract.row_files import expected_name, staging_folder
from shardinfer.contract.shard_file import FILE_TYPE
from shardinfer.core.atomic import fsync_folder, naming_full_disk
from shardinfer.core.errors import UserError


class ShardFiles:
    """Writes a shard's file columns into its staging folder and describes each file for the table."""

    def __init__(self, folder: str, suffixes: dict[str, str]) -> None:
        self.folder = Path(folder)
        self.staging = staging_folder(folder)
        self.suffixes = suffixes
        self.committed = False
        self.unsynced: list[Path] = []

    def sync(self) -> None:
        """The files written since the last call, and their names in the staging folder, on disk:
        before the window that names them is committed."""
        for path in self.unsynced:
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_folder(self.staging)
        self.unsynced = []

    def commit(self) -> None:
        """The staging folder, synced to disk, takes the folder's name (replacing an earlier one)."""
        self.sync()
        shutil.rmtree(self.folder, ignore_errors=True)
        os.replace(self.staging, self.folder)
        self.committed = True

    def write(self, column: str, values: list, index: np.ndarray) -> pa.Array:
        """One file per non-None value (bytes), named by its row's index; None: no file for that row."""
        described = []
        for value, row in zip(values, index.tolist()):
            if value is None:
                described.append(None)
                continue
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise UserError(f"row {row}: column `{column}` is a file column; its value must be bytes (or None), "
                                f"got {type(value).__name__}")
            name = expected_name(row, column, self.suffixes)
            data = bytes(value)
            with naming_full_disk(self.staging / name):
                (self.staging / name).write_bytes(data)
            self.unsynced.append(self.staging / name)
            described.append({"path": str(self.folder / name), "size": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()})
        return pa.array(described, type=FILE_TYPE)


@contextmanager
def staged_files(folder: str | None, suffixes: dict[str, str]) -> Iterator[ShardFiles | None]:
    """A ShardFiles whose staging folder replaces `folder` when its `commit()` is called (by the
    table's writer, just before the table takes its name: `atomic_parquet_writer(before_commit=)`).
    A staging folder left by a stopped job is kept: its files may belong to committed windows,
    which resuming proves (`shardinfer.shard.resume`), removing the others. A failure in the block
    after the commit renames the committed folder back to staging. None (and nothing on disk) when the shard job has
    no files folder."""
    if folder is None:
        yield None
        return
    files = ShardFiles(folder, suffixes)
    files.staging.mkdir(parents=True, exist_ok=True)  # a stopped job's: kept for its committed windows
    try:
        yield files
        if not files.committed:
            raise RuntimeError(f"files of `{folder}` were staged but never committed with their table")
    except BaseException:
        if files.committed:  # back to staging, where the committed windows' files are looked for
            shutil.rmtree(files.staging, ignore_errors=True)
            os.replace(files.folder, files.staging)
        raise
