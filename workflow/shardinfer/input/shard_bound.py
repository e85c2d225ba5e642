"""How many shards can help: checked when the Snakefile loads, before Snakemake builds a job per shard.

Every shard is a Snakemake job: its DAG is built before the first job starts (about a second per
1,000 shards here), and every shard job starts Python and loads the model. A shard beyond the
input's rows only adds that cost, so a large count above the rows is refused, in one line, when
the rows are cheap to know: Parquet footers give them exactly (milliseconds); an uncompressed CSV
or JSONL file has at most one row per line, so its newlines bound them. Counting stops as soon as
the shards are reached, so a large input costs no more than a small one. Up to `FEW_SHARDS`, extra
shards stay allowed as empty jobs that load no model: a config written for the full data also runs
on a small sample of it.
"""

from __future__ import annotations

from pathlib import Path

from shardinfer.config import InputSettings
from shardinfer.errors import UserError
from shardinfer.input.discovery import INPUT_FORMATS

FEW_SHARDS = 1000  # above this, shards beyond the input's rows are refused
MANY_SHARDS = 2000  # above this, the terminal says what the DAG costs
# Snakemake's DAG for the workflow's shard jobs, per 1,000 shards: a 10,000-shard dry run on a
# 2-core machine (scripts/load_check.py), within 1.1x of a bare Snakefile with the same rules.
DAG_SECONDS_PER_1000 = 1.0
CHUNK_BYTES = 1 << 22


def lines(path: str, enough: int) -> int:
    """Lines in the file, counted in 4 MiB chunks until there are `enough` (then `enough` or more).
    A line ends at \\n, \\r\\n or a lone \\r, as Arrow's CSV reader takes them (a \\r\\n cut by a chunk's
    end counts twice: still a bound); a last line without an end counts."""
    count, last = 0, b"\n"
    with open(path, "rb", buffering=0) as handle:
        while count < enough and (chunk := handle.read(CHUNK_BYTES)):
            count += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            last = chunk[-1:]
    return count + (last not in b"\r\n")


def rows_at_most(files: tuple[str, ...], fmt: str, enough: int) -> tuple[int, bool] | None:
    """An upper bound on the rows of the input's files, counted until it reaches `enough`, and
    whether it is exact: Parquet's row counts (exact), a text file's lines, less a CSV file's header
    line (a bound: a blank line or a quoted newline is not a row). None for a text file whose name
    does not end in a table extension: Arrow decompresses .gz, .bz2, .zst, .lz4 ... by their
    extension, and those are not decompressed here (their newlines would be no bound)."""
    import pyarrow.parquet as pq

    total = 0
    for path in files:
        if total >= enough:
            break
        if fmt == "parquet":
            total += pq.ParquetFile(path).metadata.num_rows
        elif Path(path).suffix.lower() not in INPUT_FORMATS:
            return None
        else:
            total += max(lines(path, enough - total + 1) - (fmt == "csv"), 0)
    return total, fmt == "parquet"


def check_shard_count(inp: InputSettings, shards: int) -> None:
    """Refuse more than `FEW_SHARDS` shards when the input surely has fewer rows than shards."""
    if shards <= FEW_SHARDS:
        return
    found = rows_at_most(inp.files, inp.format, shards)
    if found is None or found[0] >= shards:
        return
    rows, exact = found
    held = f"{rows} rows ({inp.path})" if exact else f"rows ({inp.path}: {rows} at most, one per line)"
    raise UserError(f"config `shards` {shards} is more than the input's {held}: use at most {rows}")


def shard_count_note(shards: int) -> str | None:
    """One line on what a large shard count costs; None for a usual count."""
    if shards <= MANY_SHARDS:
        return None
    seconds = shards / 1000 * DAG_SECONDS_PER_1000
    return (f"shardinfer: {shards:,} shards are {shards:,} Snakemake jobs: their DAG takes about "
            f"{DAG_SECONDS_PER_1000:g} s per 1,000 shards to build (~{seconds:,.0f} s) before any job starts, "
            "and every shard job starts Python and loads the model; a few shards per GPU is usually enough")
