"""A shard's pieces and its record: the contract between the shard job that writes them
(`shardinfer.shard.pieces`) and gather, which proves a shard by them without reading its values again.

A shard job writes its rows into its shard file, results/shards/3.parquet; with `output.layout:
parts` it rolls over to a new piece at a window boundary once a piece reaches `output.part_size`:
3.parquet holds the first rows, 3.1.parquet the next, and so on. Every piece is a Parquet file of
the shard file's columns and identity (IDENTITY_KEY); its footer holds the digest of its values
(CONTENT_KEY) and its place (PIECE_KEY), the last piece's also the job's stats (STATS_KEY).

Once every piece has its final name, the job writes the shard's record beside them,
`.3.record.json`: the shard's identity, its stats, and for each piece its name, first row, rows,
value digest, SHA-256 of its bytes and its stat identity (size, mtime, ctime, inode, device). A file
changed after that (edited, even with its size and mtime put back; replaced; copied) no longer has
that stat identity: gather then reads its bytes again, and where they differ, its values.

The shard file itself is a symbolic link to the first piece's bytes, `.3.parquet.data`: Snakemake
touches a rule's outputs once its job has ended (a new mtime and ctime, which would no longer be the
stat identity the job recorded), and touches a link, never its target. Every reader follows the link.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from shardinfer.core.atomic import write_json_atomic

PIECE_KEY = b"shardinfer.piece"  # a piece's footer: {"piece": k, "first": its first row}
RECORD_FORMAT = "shardinfer.record/1"
STAT_FIELDS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def piece_path(shard_file: str | Path, piece: int) -> Path:
    """Piece 0 is the shard file itself (the rule's output); piece k lies beside it as `3.k.parquet`."""
    shard_file = Path(shard_file)
    return shard_file if piece == 0 else shard_file.with_name(f"{shard_file.stem}.{piece}{shard_file.suffix}")


def first_piece_data(shard_file: str | Path) -> Path:
    """Where the first piece's bytes lie: `.3.parquet.data`, which the shard file links to (named as
    the job's other files beside it, and by no pattern of Parquet files: `*.parquet` is the shards)."""
    shard_file = Path(shard_file)
    return shard_file.with_name(f".{shard_file.name}.data")


def later_pieces(shard_file: str | Path) -> list[Path]:
    """The pieces after the first that lie beside the shard file, in piece order."""
    shard_file = Path(shard_file)
    pattern = re.compile(rf"{re.escape(shard_file.stem)}\.(\d+){re.escape(shard_file.suffix)}")
    found = [(int(match.group(1)), entry) for entry in shard_file.parent.glob(f"{shard_file.stem}.*")
             if (match := pattern.fullmatch(entry.name))] if shard_file.parent.is_dir() else []
    return [path for _, path in sorted(found)]


def record_path(shard_file: str | Path) -> Path:
    """`results/shards/.3.record.json` beside `results/shards/3.parquet`: dot-named, as the job's
    other files beside it (`.3.parquet.partial`, `.3.parquet.windows`), so readers pass it over."""
    shard_file = Path(shard_file)
    return shard_file.with_name(f".{shard_file.stem}.record.json")


def stat_identity(path: str | Path) -> dict[str, int]:
    """What changes when a file's bytes or its inode's links change: size, mtime and ctime in
    nanoseconds, inode and device. ctime cannot be set back, so an edit with its mtime restored shows."""
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns, "ino": stat.st_ino,
            "dev": stat.st_dev}


def write_record(path: str | Path, identity: dict, stats: dict, pieces: list[dict]) -> None:
    """The shard's record (module docstring); `pieces`: each piece's name, first, rows, content, sha256, stat."""
    write_json_atomic(path, {"format": RECORD_FORMAT, "identity": identity, "stats": stats, "pieces": pieces})


def read_record(path: str | Path) -> dict | None:
    """The shard's record, or None where there is none or it is not one (a shard of an earlier version)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == RECORD_FORMAT else None
