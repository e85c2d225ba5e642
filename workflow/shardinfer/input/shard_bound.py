"""How many shards can help: checked when the Snakefile loads, before Snakemake builds a job per shard.

Every shard is a Snakemake job: its DAG is built before the first job starts (about a second per
1,000 shards here), and every shard job starts Python and loads the model. A shard beyond the
input's rows only adds that cost, so a large count above the rows is refused, in one line, when
the rows are cheap to know (`Format.rows_at_most`): Parquet footers and Arrow batch headers give
them exactly (milliseconds); an uncompressed text file has at most one row per line, so its
newlines bound them. Counting stops as soon as
the shards are reached, so a large input costs no more than a small one. Up to `FEW_SHARDS`, extra
shards stay allowed as empty jobs that load no model: a config written for the full data also runs
on a small sample of it.
"""

from __future__ import annotations

from shardinfer.core.errors import UserError
from shardinfer.input.formats import format_named
from shardinfer.settings.config import InputSettings

FEW_SHARDS = 1000  # above this, shards beyond the input's rows are refused
MANY_SHARDS = 2000  # above this, the terminal says what the DAG costs
# Snakemake's DAG for the workflow's shard jobs, per 1,000 shards: a 10,000-shard dry run on a
# 2-core machine (scripts/benchmarks/load_check.py), within 1.1x of a bare Snakefile with the same rules.
DAG_SECONDS_PER_1000 = 1.0


def rows_at_most(files: tuple[str, ...], fmt: str, enough: int) -> tuple[int, bool] | None:
    """An upper bound on the rows of the input's files, counted until it reaches `enough`, and
    whether it is exact (`Format.rows_at_most`: Parquet's and Arrow's row counts are exact, a text
    file's lines a bound); None when a file's format offers none. A file it cannot read is refused
    in one line, naming it."""
    total, exact = 0, True
    for path in files:
        if total >= enough:
            break
        found = format_named(fmt).rows_at_most(path, enough - total)
        if found is None:
            return None
        total, exact = total + found[0], exact and found[1]
    return total, exact


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
