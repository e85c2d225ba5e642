"""The proven shards published as a folder of parts (`output.layout: parts`), with its manifest.

On a shared filesystem each part is a hard link of a shard's piece (the same inode: no second copy
of the values on disk); where a link is impossible (the folder on another filesystem) it is a copy,
and the log says so. The folder is made beside its final name (`results/.predictions.partial/`)
and takes it, replacing the previous one, only once every part and the manifest are in it.

Linking a file (and unlinking the previous folder's link) changes its ctime, which each shard's
record holds (`shardinfer.contract.pieces`): once the folder is in place, each record takes the
pieces' new stat identity, so that the next gather finds them unchanged as well.

Without a shared filesystem the shard jobs wrote the parts straight into the bucket (one per shard),
and gather writes the manifest alone (`parts_in_place`).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
from pathlib import Path

from shardinfer.contract.file_digest import file_digest
from shardinfer.contract.pieces import record_path, stat_identity, write_record
from shardinfer.core.atomic import atomic_path, partial_path, replace_folder
from shardinfer.plan.plan_file import Plan
from shardinfer.proof.manifest import MANIFEST_NAME, dumps, manifest, part_names
from shardinfer.proof.shards import Piece, ShardFile

log = logging.getLogger(__name__)
CANNOT_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def published_pieces(shards: list[ShardFile]) -> list[tuple[ShardFile, Piece]]:
    """The pieces that become parts, in index order: those with rows; a table without rows keeps its
    first piece, whose columns say what the table would hold."""
    pieces = [(shard, piece) for shard in shards for piece in shard.files_in_order]
    with_rows = [(shard, piece) for shard, piece in pieces if piece.rows]
    return with_rows or pieces[:1]


def known_bytes(shards: list[ShardFile]) -> list[ShardFile]:
    """The shards with each piece's SHA-256: its record's (the bytes proven the same), else read now."""
    return [dataclasses.replace(shard, pieces=tuple(dataclasses.replace(p, sha256=p.sha256 or file_digest(p.path))
                                                    for p in shard.files_in_order)) for shard in shards]


def part_entries(pieces: list[tuple[ShardFile, Piece]], names: list[str], sizes: list[int]) -> list[dict]:
    """Each part as the manifest lists it: its piece's facts, its bytes' SHA-256 and size."""
    return [{"name": name, "rows": piece.rows, "start": piece.first, "end": piece.first + piece.rows,
             "content": piece.content, "sha256": piece.sha256, "bytes": size, "shard": shard.shard}
            for (shard, piece), name, size in zip(pieces, names, sizes)]


def place(source: str, target: Path, linking: bool) -> bool:
    """`target` as a hard link of `source` (of the file a shard file links to), or a copy where a link
    is impossible; whether it is a link."""
    if linking:
        try:
            os.link(os.path.realpath(source), target)
            return True
        except OSError as error:
            if error.errno not in CANNOT_LINK:
                raise
            log.warning("WARNING cannot hard-link `%s` into `%s` (%s): the parts are copies, a second copy of the "
                        "values on disk (put the results folder and the shards on one filesystem to avoid it)",
                        source, target.parent, error.strerror)
    shutil.copyfile(source, target)
    return False


def publish_parts(shards: list[ShardFile], plan: Plan, digest: str, folder: str) -> dict:
    """Make `folder` the proven shards' parts and their manifest, replacing what was there; returns
    the manifest."""
    shards = known_bytes(shards)
    pieces = published_pieces(shards)
    names = part_names(len(pieces))
    target = Path(folder)
    staging = partial_path(target)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    linking = True
    for (_, piece), name in zip(pieces, names):
        linking = place(piece.path, staging / name, linking)
    sizes = [(staging / name).stat().st_size for name in names]
    content = manifest(part_entries(pieces, names, sizes), plan, digest, schema_of(shards))
    (staging / MANIFEST_NAME).write_text(dumps(content))
    replace_folder(staging, target)
    log.info("published %d parts (%d bytes, %s) and their manifest in %s", len(names), content["bytes"],
             "hard links of the shards' files" if linking else "copies", folder)
    refresh_records(shards)
    return content


def schema_of(shards: list[ShardFile]):
    return next((s.schema for s in shards if s.rows), shards[0].schema if shards else None)


def refresh_records(shards: list[ShardFile]) -> None:
    """Each shard's record with its pieces' stat identity as the links left them (and, for a shard
    without a record or whose bytes were read again, the SHA-256 of its bytes): the next gather finds
    them unchanged. Written only for the shards gather proved in full."""
    for shard in shards:
        if shard.identity is None:
            continue
        pieces = [{"name": Path(p.path).name, "first": p.first, "rows": p.rows, "content": p.content,
                   "sha256": p.sha256, "stat": stat_identity(p.path)}
                  for p in shard.files_in_order]
        write_record(record_path(shard.path), shard.identity, shard.stats, pieces)


def parts_in_place(shards: list[ShardFile], names: list[str], plan: Plan, digest: str, path: str) -> dict:
    """Without a shared filesystem: the manifest of parts the shard jobs wrote into the bucket
    themselves (`names`: each shard's part, from the records gather proved them by)."""
    pieces = [(shard, shard.files_in_order[0]) for shard in shards]
    sizes = [shard.record["pieces"][0]["stat"]["size"] for shard in shards]
    content = manifest(part_entries(pieces, names, sizes), plan, digest, None)
    with atomic_path(path) as tmp:
        tmp.write_text(dumps(content))
    return content
