"""Staged copies: the parts that shards cannot read by their range alone, rewritten once by the plan.

Two kinds of part cannot be read in part, so that 64 shards over one of them read it about 32 times:

- a compressed CSV or JSONL file (.gz, .bz2, .lz4, .zst) cannot seek: each shard would
  decompress it from the start up to its span;
- a Parquet file with a row group that holds rows of several shards (pandas and many exporters
  write one huge group): pyarrow (26) reads no row range inside a row group (apache/arrow#45284),
  so each shard would read the group from its start up to its last row.

The plan rule copies such a part into its `staged` folder (`results/staged/`, a declared output of
the rule, so a replan replaces it), as its format writes it (`Format.rows_read` says how many rows
its shards would read in place, `Format.stage` writes the copy): a compressed file decompressed
byte for byte (the plan's spans are offsets in the decompressed bytes already), a Parquet file
rewritten with only the columns the shards read and a row group boundary at every shard boundary.
A format that reads any row range in place (Arrow) is never staged. The shards read the copy; all
of them together then read it about once. A format that can start a shard only at a file's first
row and has no copy to offer (`Format.reads_from_start`) is refused instead, in one line, where
staging would have copied it; `input.stage: never` reads it in place, with a warning in the log.

`input.stage` says when: `auto` (the default) stages a part when its shards would read more than
STAGE_RATIO times its rows and at least STAGE_MIN_BYTES more than the file; `always` whenever they
would read more than its rows; `never` reads every part in place.

The copy is proven as the input is: it is written while the part's content digest is computed
alongside, and refused unless that is the planned digest; the plan records the copy's path, size,
mtime and SHA-256; a shard job refuses a copy of another size or mtime, and gather one whose bytes
are not those recorded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from shardinfer.contract.file_digest import file_digest
from shardinfer.core.errors import ProofError, UserError
from shardinfer.input.formats import format_named
from shardinfer.input.formats.base import Held
from shardinfer.input.identity import digest_alongside, fingerprint
from shardinfer.settings.config import InputSettings

log = logging.getLogger(__name__)
STAGE_RATIO = 1.2  # auto: stage when the shards would read more than this many times the part's rows
STAGE_MIN_BYTES = 64 << 20  # ... and at least this much more than the part's file


@dataclass(frozen=True)
class Staged:
    """A part's staged copy as planned: what the shards read instead of the part."""
    path: str
    size: int
    mtime_ns: int
    digest: str  # `sha256:<hex>` of the copy's bytes
    columns: tuple[str, ...] | None = None  # a Parquet copy's columns; None: all of the part (a text copy)

    @classmethod
    def from_json(cls, data: dict) -> Staged:
        columns = data.get("columns")
        return cls(**{**data, "columns": None if columns is None else tuple(columns)})

    def check_holds(self, columns: list[str], part: str) -> None:
        """Refuse a Parquet copy made for other columns than the run reads (a plan from before
        `keep_columns` changed, which Snakemake reruns unless its params trigger is off)."""
        missing = [column for column in columns if self.columns is not None and column not in self.columns]
        if missing:
            raise UserError(f"staged copy `{self.path}` of input `{part}` holds the columns {list(self.columns)}, "
                            f"not `{missing[0]}`; rerun the plan (snakemake --forcerun plan)")

    def check_unchanged(self, part: str) -> None:
        """Refuse a copy that has disappeared, or has another size or mtime, since planning."""
        if not os.path.isfile(self.path):
            raise UserError(f"staged copy `{self.path}` of input `{part}` has disappeared since planning; "
                            "rerun the plan (snakemake --forcerun plan)")
        if fingerprint(self.path) != {"size": self.size, "mtime_ns": self.mtime_ns}:
            raise UserError(f"staged copy `{self.path}` of input `{part}` changed since planning; "
                            "rerun the plan (snakemake --forcerun plan)")

    def check_content(self, part: str) -> None:
        """Refuse a copy whose bytes are not those the plan wrote (gather: read once, hashed)."""
        found = file_digest(self.path)
        if found != self.digest:
            raise ProofError(f"staged copy `{self.path}` of input `{part}` changed since planning: other content "
                            f"({self.digest} -> {found}); rerun the plan (snakemake --forcerun plan)")


def should_stage(mode: str, rows: int, size: int, read: int) -> bool:
    """Whether to stage a part of `rows` rows and `size` bytes that its shards would read `read` rows of."""
    if mode == "never" or read <= rows:
        return False
    extra_bytes = size * (read - rows) / rows
    return mode == "always" or (read > STAGE_RATIO * rows and extra_bytes >= STAGE_MIN_BYTES)


def wants_staging(inp: InputSettings, path: str, rows: int, size: int, held: Held) -> bool:
    """Whether a part (`rows` rows, `size` bytes) should be staged for shards reading `held` of it:
    never for a format that reads any row range in place (its `rows_read` are the ranges). A part
    that would be, of a format with no copy to offer (no `staged_suffix`), is refused."""
    fmt = format_named(inp.format)
    if not held:
        return False
    read = fmt.rows_read(path, held)
    if inp.stage == "never" or fmt.staged_suffix is None:
        if should_stage("auto" if inp.stage == "never" else inp.stage, rows, size, read):
            _many_reads(inp, path, rows, read, len(held))
        return False
    return should_stage(inp.stage, rows, size, read)


def _many_reads(inp: InputSettings, path: str, rows: int, read: int, shards: int) -> None:
    """A part that its shards would read many times over and that is not staged: refused, unless
    `input.stage: never` says to read it so (then said in the log)."""
    fmt = format_named(inp.format)
    why = f"input `{path}`: its {shards} shards would read it {read / rows:.1f} times over in place" + (
        f" ({fmt.name} files are read only from their first row)" if fmt.reads_from_start else "")
    if inp.stage == "never":
        log.warning("WARNING %s, as input.stage: never says", why)
        return
    raise UserError(f"{why}, and {fmt.name} parts are never staged; give fewer shards, split it into parts (a "
                    "folder of files), or set input.stage: never to read it so")


def stage_part(inp: InputSettings, path: str, digest: str, held: Held, target: Path) -> Staged:
    """Copy a part for its shards (`held`: their ranges in it) to `target` (`Format.stage`), proving
    that the bytes copied are the planned ones: its digest, computed alongside, is `digest`, and the
    file was not replaced meanwhile (the same inode, size and mtime before and after)."""
    before = _stamp(path)
    with digest_alongside(path) as content, _writing(target):
        copy_digest, columns = format_named(inp.format).stage(inp, path, held, target)
    if content.result() != digest or _stamp(path) != before:
        target.unlink(missing_ok=True)
        raise UserError(f"input `{path}` changed while it was being staged; rerun the plan once it is complete")
    stat = target.stat()
    return Staged(str(target), stat.st_size, stat.st_mtime_ns, copy_digest, columns)


def _stamp(path: str) -> tuple[int, int, int]:
    stat = os.stat(path)
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


@contextmanager
def _writing(target: Path) -> Iterator[None]:
    """A fault writing the copy (a full disk) named as such, not as the input's: the format's
    reads name theirs as the input's (UserError) first."""
    try:
        yield
    except (OSError, pa.ArrowException) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"cannot write the staged copy `{target}`: {first_line}") from error


def staged_name(position: int, fmt: str) -> str:
    """The copy of the input's part number `position` (from 0): `00003.parquet`, `00003.csv`, ..."""
    return f"{position:05d}{format_named(fmt).staged_suffix}"
