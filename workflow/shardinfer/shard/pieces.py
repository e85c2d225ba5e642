"""A shard job's output files: the shard file, rolled over into pieces at window boundaries once a
piece reaches the part size (`output.layout: parts`), then the shard's record of what it wrote
(`shardinfer.contract.pieces`).

Every piece is written beside its final name, under its attempt's own
(`.3.1.parquet.<host>-<pid>.partial`, shardinfer.core.atomic) and takes it only when the whole shard is
written, the first piece last: its bytes (`.3.parquet.data`), then the shard file (the rule's
output), a link to them, so that a job that stops leaves no piece that looks finished. Each piece's
values are hashed as they are written; its footer gets their digest and its place, the last one's
also the job's stats. After the renames, each piece's bytes are read back once for their SHA-256 and
its stat identity taken, for the record.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.contract.content_digest import ContentHasher
from shardinfer.contract.file_digest import file_digest
from shardinfer.contract.pieces import (
    PIECE_KEY,
    first_piece_data,
    later_pieces,
    piece_path,
    record_path,
    stat_identity,
    write_record,
)
from shardinfer.contract.shard_file import STATS_KEY, dictionary_columns
from shardinfer.core.atomic import attempt_path, fsync_folder, naming_full_disk, remove_dead_attempts

log = logging.getLogger(__name__)


class ShardPieces:
    """What the shard's windows are written through: `write_table` as a ParquetWriter takes it, into the
    open piece, which is closed for the next before a window that would take it past `part_bytes`
    (None: never). A window's bytes on disk are foreseen from its Arrow bytes and what the shard's
    windows so far took on disk per Arrow byte (the writer writes each window's row group out at
    once, so the file's size after it is exact); a piece holds at least one window, so only a window
    larger than `part_bytes` alone, or one that compresses worse than those before it, makes a
    piece larger."""

    def __init__(self, output: str | Path, schema: pa.Schema, first_row: int, part_bytes: int | None = None):
        self.output, self.schema, self.part_bytes = Path(output), schema, part_bytes
        self.closed: list[dict] = []  # each closed piece: {"name", "first", "rows", "content"}
        self.partials: list[Path] = []  # every piece's path until it takes its name
        self.next_row, self.stats = first_row, None
        self.disk_bytes = self.arrow_bytes = 0  # the shard's windows so far: bytes on disk, their Arrow bytes
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        path = piece_path(self.output, len(self.closed))
        remove_dead_attempts(path)  # an attempt's own name (shardinfer.core.atomic): two runs never share one
        self.partials.append(attempt_path(path))
        self.first, self.content = self.next_row, ContentHasher()
        self.writer = pq.ParquetWriter(self.partials[-1], self.schema, write_page_checksum=True,
                                       use_dictionary=dictionary_columns(self.schema))
        self.size = self.partials[-1].stat().st_size  # the open piece's bytes on disk so far

    def write_table(self, table: pa.Table) -> None:
        """One window's rows; a new piece first when they would take the open one past the part size
        (never an empty piece)."""
        if self.part_bytes:
            self._write_within_part(table)
        else:
            self.writer.write_table(table)
        self.content.update(table)
        self.next_row += table.num_rows

    def _write_within_part(self, table: pa.Table) -> None:
        """The window into the open piece, or a new one first where its foreseen bytes would take the
        open one past `part_bytes`; what it took on disk counted for the next."""
        arrow = table.nbytes
        foreseen = arrow * self.disk_bytes // self.arrow_bytes if self.arrow_bytes else 0
        if self.content.rows and self.size + foreseen > self.part_bytes:
            self._close()
            self._open()
        self.writer.write_table(table)
        size = self.partials[-1].stat().st_size
        self.disk_bytes, self.arrow_bytes = self.disk_bytes + size - self.size, self.arrow_bytes + arrow
        self.size = size

    def _close(self, extra: dict[bytes, bytes] | None = None) -> None:
        place = {"piece": len(self.closed), "first": self.first}
        self.writer.add_key_value_metadata({**self.content.metadata(), PIECE_KEY: json.dumps(place).encode(),
                                            **(extra or {})})
        self.writer.close()
        self.closed.append({"name": piece_path(self.output, len(self.closed)).name, "first": self.first,
                            "rows": self.content.rows, "content": self.content.digest()})

    def finish(self, stats: dict) -> None:
        """Close the last piece, with the job's stats in its footer."""
        self.stats = stats
        self._close({STATS_KEY: json.dumps(stats).encode()})


def remove_pieces(output: str | Path) -> None:
    """A shard's pieces after the first and its record, from an earlier run of its job: the rule's
    output itself Snakemake removes before the job runs."""
    for path in [*later_pieces(output), record_path(output), first_piece_data(output)]:
        path.unlink(missing_ok=True)


@contextmanager
def shard_pieces(output: str | Path, schema: pa.Schema, first_row: int, part_bytes: int | None = None,
                 before_commit: Callable[[], None] | None = None, record: str | Path | None = None,
                 identity: dict | None = None) -> Iterator[ShardPieces]:
    """A ShardPieces whose pieces take their names when the block ends without error and `finish` was
    called (`before_commit` runs just before: the files folder's commit), then the shard's record is
    written (at `record`, by default beside the shard file). On error every partial piece is removed."""
    remove_pieces(output)
    pieces = None
    try:
        with naming_full_disk(output):
            pieces = ShardPieces(output, schema, first_row, part_bytes)
            yield pieces
            if pieces.writer.is_open:
                raise RuntimeError(f"the pieces of `{output}` were written but never finished")
            commit(pieces, before_commit)
            write_record(record or record_path(output), identity or {}, pieces.stats,
                         recorded(Path(output), pieces.closed))
    except BaseException:
        if pieces is not None:
            if pieces.writer.is_open:
                pieces.writer.close()
            for path in pieces.partials:
                path.unlink(missing_ok=True)
        raise
    if len(pieces.closed) > 1:
        log.info("wrote the shard in %d pieces of about %d bytes each (output.part_size)", len(pieces.closed),
                 part_bytes)


def commit(pieces: ShardPieces, before_commit: Callable[[], None] | None) -> None:
    """Every piece synced, then named: the later ones first, the shard file (the rule's output) last."""
    for path in pieces.partials:
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    if before_commit is not None:
        before_commit()
    for k in reversed(range(1, len(pieces.closed))):
        os.replace(pieces.partials[k], piece_path(pieces.output, k))
    data = first_piece_data(pieces.output)
    os.replace(pieces.partials[0], data)
    link = attempt_path(pieces.output)
    link.unlink(missing_ok=True)
    os.symlink(data.name, link)
    os.replace(link, pieces.output)
    fsync_folder(pieces.output.parent)


def recorded(output: Path, closed: list[dict]) -> list[dict]:
    """Each piece as the record holds it: its facts, the SHA-256 of its bytes and its stat identity,
    taken after its rename (a rename changes the ctime), the first piece's through the link."""
    return [{**piece, "sha256": file_digest(str(piece_path(output, k))), "stat": stat_identity(piece_path(output, k))}
            for k, piece in enumerate(closed)]
