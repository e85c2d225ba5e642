"""Files per row (an image per input row): written by the runner, never by the task's code, and
proven at gather like the rows.

A shard's files go into a staging folder beside its final one (`results/files/.3.partial`), each
named by its row's global index (`000001234.png`), so two shards or two rows can never write the
same name. The folder takes its final name only once the shard's table is complete and closed,
just before the table takes its own: a failed job leaves neither (only the staging folder, whose
files its committed windows may name: `shardinfer.shard.resume`), and a job killed between the two
renames leaves a folder without its table, which Snakemake reruns as incomplete and gather refuses. The table records each file's path (relative to
the working directory), byte size and SHA-256; gather checks every one and refuses any file the
table does not name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from shardinfer.atomic import fsync_folder, naming_full_disk, partial_path
from shardinfer.errors import ProofError, UserError
from shardinfer.input.identity import file_digest
from shardinfer.proof.shard_file import ERROR_COLUMN, FILE_TYPE, INDEX_COLUMN, file_name


SNAKEMAKE_MARKER = ".snakemake_timestamp"  # Snakemake's own mark in a directory() output


def staging_folder(folder: str | Path) -> Path:
    """`results/files/.3.partial`: named as a partial file is (shardinfer.atomic)."""
    return partial_path(Path(folder))


def expected_name(index: int, column: str, suffixes: dict[str, str]) -> str:
    """`000001234.png`; with several file columns, `000001234.<column>.png` keeps them apart."""
    suffix = suffixes[column] if len(suffixes) == 1 else f".{column}{suffixes[column]}"
    return file_name(index, suffix)


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


def prove_files(table: pa.Table, folder: str, suffixes: dict[str, str], recorded: str | None = None) -> set[str]:
    """Every row that names a file has exactly that file: its own name (by index), size and SHA-256.
    A failed row (row_errors: record, its `error` set) has no file by design, and must name none.
    `recorded`: the folder the rows name when the files are still elsewhere (a resumed shard's
    staging folder); by default `folder`. Returns the names seen, so the caller can refuse files no
    row names. Raises ProofError naming the row."""
    index = table.column(INDEX_COLUMN).to_numpy()
    errors = table.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in table.column_names else [None] * len(index)
    seen = set()
    for column in suffixes:
        for row, value, error in zip(index.tolist(), table.column(column).to_pylist(), errors):
            if value is not None and error is not None:
                raise ProofError(f"row {row} failed (its `{ERROR_COLUMN}` is set) but column `{column}` names a file")
            if value is None:
                continue
            name = expected_name(row, column, suffixes)
            path = Path(folder) / name
            if value["path"] != str(Path(recorded or folder) / name):
                raise ProofError(f"row {row}: column `{column}` names `{value['path']}`, not its own file "
                                 f"`{Path(recorded or folder) / name}`")
            if not path.is_file():
                raise ProofError(f"row {row}: file `{path}` is missing; rerun its shard")
            if path.stat().st_size != value["size"]:
                raise ProofError(f"row {row}: file `{path}` has {path.stat().st_size} bytes, its row records "
                                 f"{value['size']} (truncated or replaced); rerun its shard")
            if file_digest(str(path)) != f"sha256:{value['sha256']}":
                raise ProofError(f"row {row}: file `{path}` is not the file its row records (SHA-256 differs: "
                                 "altered or swapped); rerun its shard")
            seen.add(name)
    return seen


def refuse_unlisted(folder: str, seen: set[str]) -> None:
    """A file in a shard's folder that no row names (another run's, or one put there by hand)."""
    if not Path(folder).is_dir():
        raise ProofError(f"files folder `{folder}` is missing; rerun its shard")
    for entry in sorted(Path(folder).iterdir()):
        if entry.name not in seen and entry.name != SNAKEMAKE_MARKER:
            raise ProofError(f"file `{entry}` is in the shard's files folder but no row names it; "
                             "remove it or rerun the shard")
