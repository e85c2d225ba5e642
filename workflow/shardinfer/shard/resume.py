"""Resume inside a shard: each window is committed as soon as it is written, so a job that is
killed (SIGKILL, a lost node, a time limit, a preemption) loses at most the window it was computing.

A shard's committed windows live beside its file, in `results/shards/.3.parquet.windows/`, one
Parquet file per window named by its first row (`000000016384.parquet`), written atomically
(`shardinfer.core.atomic`) once the window's per-row files are on disk. Each carries the shard file's
own schema and identity (plan, range, settings digest, task, files), and in its metadata its rows,
its content digest and the shard's tally after it (rows, tokens, truncations, row errors).

A rerun keeps the windows that continue the shard's rows without a gap from its first row, each
proven: the same identity, exactly its rows in order, the content digest it recorded, every
per-row file it names as recorded. The first window that fails a check ends what is kept; it and
every later window are removed, as are the per-row files no kept window names, so windows of
another plan or settings digest are never reused. When the last window is committed the shard file
is assembled from the windows in order (and proven at gather as ever), then the folder is removed.
The folder is no Snakemake output, so Snakemake's cleanup of a failed job's outputs leaves it.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.contract.content_digest import table_digest
from shardinfer.contract.row_files import prove_files
from shardinfer.contract.shard_file import IDENTITY_KEY, INDEX_COLUMN
from shardinfer.core.atomic import atomic_path
from shardinfer.core.errors import ProofError
from shardinfer.shard.row_files import ShardFiles

log = logging.getLogger(__name__)

COMMIT_KEY = b"shardinfer.window"  # {"first", "end", "digest", "tally"}
WINDOW_DIGITS = 12


def windows_folder(output: str | Path) -> Path:
    """`results/shards/.3.parquet.windows`: hidden, as a partial file is, so no later step reads it."""
    output = Path(output)
    return output.parent / f".{output.name}.windows"


def window_path(folder: Path, first: int) -> Path:
    return folder / f"{first:0{WINDOW_DIGITS}d}.parquet"


def commit_window(folder: Path, table: pa.Table, tally: dict) -> None:
    """Write one window's rows (the shard file's schema, identity included) as a file of its own,
    atomically, with its range, content digest and the shard's tally after it."""
    first = int(table.column(INDEX_COLUMN)[0].as_py())
    meta = {"first": first, "end": first + table.num_rows, "digest": table_digest(table), "tally": tally}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), COMMIT_KEY: json.dumps(meta).encode()})
    # `keep_committed` removed every earlier attempt's file when the job began: not listed per window.
    with atomic_path(window_path(folder, first), tidy=False) as tmp:
        pq.write_table(table, tmp, write_page_checksum=True)


@dataclass(frozen=True)
class Kept:
    """What a rerun keeps of a shard's committed windows: their files in order, the row the job
    goes on from, and the shard's tally after the last of them (None: nothing kept)."""

    paths: tuple[Path, ...]
    next_row: int
    tally: dict | None

    @property
    def rows(self) -> int:
        return self.tally["rows"] if self.tally else 0


def why_not_kept(path: Path, identity: dict, first: int, files: ShardFiles | None) -> str | None:
    """None when `path` is a committed window of this shard (identity), starting at row `first`,
    whose rows, values and per-row files are as it recorded; else why not."""
    try:
        metadata = pq.read_schema(path).metadata or {}
        if json.loads(metadata.get(IDENTITY_KEY, b"null")) != identity:
            return "made under another plan or settings"
        meta = json.loads(metadata[COMMIT_KEY])
        if meta["first"] != first:
            return f"starts at row {meta['first']}, not at row {first} where the kept windows end"
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, KeyError, ValueError, pa.ArrowException) as error:
        return f"unreadable ({type(error).__name__}: {error})"
    index = table.column(INDEX_COLUMN).to_numpy()
    if not np.array_equal(index, np.arange(first, meta["end"])):
        return f"its rows are not rows [{first}, {meta['end']}) in order"
    if table_digest(table) != meta["digest"]:
        return "its values differ from what it recorded"
    if files is not None:
        try:
            prove_files(table, str(files.staging), files.suffixes, recorded=str(files.folder))
        except ProofError as error:
            return str(error)
    return None


def keep_committed(folder: Path, identity: dict, start: int, files: ShardFiles | None) -> Kept:
    """Keep the shard's committed windows that continue its rows from `start` and prove sound;
    remove every other window (another plan's or settings', one after a gap, a damaged one) and
    the per-row files in the staging folder that no kept window names."""
    folder.mkdir(parents=True, exist_ok=True)
    kept, row, tally = [], start, None
    for path in sorted(folder.glob("*.parquet")):
        reason = why_not_kept(path, identity, row, files)
        if reason is not None:
            log.info("not keeping committed window %s: %s", path.name, reason)
            break
        meta = json.loads(pq.read_schema(path).metadata[COMMIT_KEY])
        kept.append(path)
        row, tally = meta["end"], meta["tally"]
    for entry in folder.iterdir():
        if entry not in kept:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    if files is not None:
        _remove_unnamed_files(files, kept)
    return Kept(tuple(kept), row, tally)


def _remove_unnamed_files(files: ShardFiles, kept: list[Path]) -> None:
    """Per-row files in the staging folder that no kept window names: a window's files written
    before the job was killed, ahead of its commit, or another plan's."""
    named = set()
    for path in kept:
        table = pq.read_table(path, columns=list(files.suffixes))
        for column in files.suffixes:
            named.update(Path(value["path"]).name for value in table.column(column).to_pylist() if value)
    for entry in files.staging.iterdir():
        if entry.name not in named:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def assemble(paths: list[Path] | tuple[Path, ...], writer) -> None:
    """Copy the committed windows, in order, into the shard's writer (`shard.pieces.ShardPieces`,
    which hashes the values for its footer)."""
    for path in paths:
        table = pq.read_table(path, page_checksum_verification=True).replace_schema_metadata(None)
        writer.write_table(table.cast(writer.schema))


def remove_windows(folder: Path) -> None:
    """The shard file is complete: its committed windows are no longer needed."""
    shutil.rmtree(folder, ignore_errors=True)


def resume_row(folder: Path, start: int) -> int:
    """The row a rerun would go on from, read from the names of the windows committed so far (for
    the line a stopped job leaves; the rerun proves them before keeping any)."""
    row = start
    for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
        try:
            meta = json.loads(pq.read_schema(path).metadata[COMMIT_KEY])
        except (OSError, KeyError, ValueError, pa.ArrowException):
            break
        if meta["first"] != row:
            break
        row = meta["end"]
    return row


def left_for_rerun(folder: Path, staging: Path | None, start: int) -> int:
    """After a job that failed or stopped: the row a rerun resumes at. A job that committed no
    window leaves nothing (its windows folder and staged per-row files are removed)."""
    row = resume_row(folder, start)
    if row == start:
        shutil.rmtree(folder, ignore_errors=True)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return row
