"""The values of a proven shard, read only where they must be.

A shard that is `unchanged` (`shardinfer.proof.shards`) holds the bytes its job hashed as it wrote
them: its row groups pass as they are. Any other shard is checked before its values are used: each
piece's bytes against the SHA-256 its job recorded (a plain read, about 1.5 GB/s), and where that
fails or there is no record, its values against the digest in its footer, row group by row group
as they pass (`verified_row_groups`). A shard with files per row has each file checked against its
row (name, size, SHA-256), and no other file in its folder, as its rows pass.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pyarrow as pa

from shardinfer.contract.content_digest import ContentHasher
from shardinfer.contract.file_digest import file_digest
from shardinfer.contract.row_files import prove_files, refuse_unlisted
from shardinfer.contract.shard_file import ERROR_COLUMN, INDEX_COLUMN
from shardinfer.core.errors import ProofError
from shardinfer.proof.shards import Piece, ShardFile, open_verified, read_fault

log = logging.getLogger(__name__)


def verified_row_groups(shard: ShardFile, check_values: bool = True, columns: list[str] | None = None
                        ) -> Iterator[pa.Table]:
    """The shard's row groups (of `columns`, default all), piece after piece, each page checked
    against its checksum; with `check_values`, each piece's values hashed as they pass and, after its
    last row group, refused if they are not what its job wrote. Files per row are proven as they pass."""
    where = f"shard {shard.shard} (`{shard.path}`)"
    seen = set()
    for piece in shard.files_in_order:
        content = ContentHasher() if check_values else None
        try:
            file = open_verified(piece.path)
            for group in range(file.num_row_groups):
                table = file.read_row_group(group, columns=columns)
                if content is not None:
                    content.update(table)
                if shard.files:
                    with naming_the_shard(where):
                        seen |= prove_files(table, shard.files["folder"], shard.files["columns"])
                yield table
        except (pa.ArrowException, OSError, ValueError) as error:
            raise ProofError(f"{where}: {read_fault(error)}") from error
        if content is not None and content.digest() != piece.content:
            raise ProofError(f"{where}: its values are not those its job wrote (digest {content.digest()}, "
                             f"recorded {piece.content}); delete it and rerun")
    if shard.files:
        with naming_the_shard(where):
            refuse_unlisted(shard.files["folder"], seen)


def read_ahead(tables: Iterator[pa.Table], depth: int = 2) -> Iterator[pa.Table]:
    """`tables`, read in a thread of their own up to `depth` ahead, so that reading (and hashing) the
    next row groups overlaps writing the last ones (Arrow's readers and writers release the GIL).
    An error of the reader is raised here, where the tables are taken."""
    ahead: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: tuple) -> bool:
        """Put `item` for the taker; False once it stopped taking (its own error ends the write)."""
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for table in tables:
                if not offer((table, None)):
                    return
            offer((None, None))
        except BaseException as error:  # handed to the taker, who raises it
            offer((None, error))

    reader = threading.Thread(target=read, name="gather read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            table, error = ahead.get()
            if error is not None:
                raise error
            if table is None:
                return
            yield table
    finally:
        stop.set()
        reader.join()


def same_bytes(piece: Piece) -> bool:
    """Whether a piece's bytes are still those its job recorded (False: no record of them)."""
    return piece.sha256 is not None and file_digest(piece.path) == piece.sha256


def bytes_unchanged(shard: ShardFile) -> bool:
    """Whether every piece of a shard that is no longer as its job left it (copied, its links changed,
    edited) still has the bytes its job recorded."""
    return all(map(same_bytes, shard.files_in_order))


def values_checked(shards: list[ShardFile], threads: int = 2) -> list[ShardFile]:
    """The shards whose values must be checked as they are read: of those not `unchanged`, the ones
    whose bytes differ from their record (or that have none), each piece's SHA-256 read in a thread
    of its own (hashlib and reads release the GIL)."""
    changed = [shard for shard in shards if not shard.unchanged]
    if not changed:
        return []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        same = list(pool.map(bytes_unchanged, changed))
    log.info("%d of %d shards were changed since their job wrote them (copied, touched or linked): %d have "
             "the bytes their job recorded", len(changed), len(shards), sum(same))
    return [shard for shard, kept in zip(changed, same) if not kept]


def with_bytes_unknown(shard: ShardFile) -> ShardFile:
    """A shard whose bytes are not those its record names: their SHA-256 is read again where it is needed."""
    return dataclasses.replace(shard, pieces=tuple(dataclasses.replace(p, sha256=None) for p in shard.files_in_order))


def prove_values(shard: ShardFile) -> None:
    """Read a shard whose bytes are not those recorded and refuse it unless its values are."""
    for _ in verified_row_groups(shard, columns=None):
        pass


def prove_row_files(shard: ShardFile) -> None:
    """A shard's files per row against its rows, reading only the columns that name them."""
    if not shard.files:
        return
    columns = [INDEX_COLUMN, *([ERROR_COLUMN] if ERROR_COLUMN in shard.schema.names else []), *shard.files["columns"]]
    for _ in verified_row_groups(shard, check_values=False, columns=columns):
        pass


@contextmanager
def naming_the_shard(where: str) -> Iterator[None]:
    """A failed file proof, prefixed with the shard it belongs to."""
    try:
        yield
    except ProofError as error:
        raise ProofError(f"{where}: {error}") from None
