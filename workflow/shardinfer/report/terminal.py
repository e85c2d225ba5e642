"""The few lines a user reads on the terminal after a successful run, made from results/summary.json.

Logs hold everything; these lines say what a user must know without opening them: how many rows
were written where, how fast, what was truncated (and where to see which), the headline scores
against the gold labels (`evaluate:`), and warnings such as a run that fell back to the CPU or gold
values left unscored. Free of torch: the Snakefile's `onsuccess` handler calls it.
"""

from __future__ import annotations

from collections.abc import Iterator

from shardinfer.contract.shard_file import computed
from shardinfer.scores.metrics import headline
from shardinfer.tasks import counts_tokens, task_totals


def summary_lines(summary: dict, predictions: str, summary_path: str, shard_logs: str = "logs/infer/<shard>.log",
                  report: bool = True, since: float | None = None) -> list[str]:
    """One line each: rows written, throughput, then truncation and warnings when there are any, and
    (`report`) where the figures are; `shard_logs` names the shard logs the truncation warning points to.
    `since`: when this Snakemake run began (epoch seconds), so that the throughput is that of the
    shard jobs this run ran, not of shards kept from an earlier run (None: every shard is this run's)."""
    run = summary.get("run") or {}
    rows, shards = summary["rows"], summary["shards"]
    lines = [f"shardinfer: {rows:,} rows written to {predictions}, proven complete and in input order "
             f"({shards} shard{'s' if shards != 1 else ''}, {f'index 0..{rows - 1}' if rows else 'no rows'})"
             f"{written(summary.get('output'))}"]
    if run.get("rows_per_s") is not None and rows:  # no rows: no speed to tell (the warning says why)
        padding = f"padding ratio {run['padding_ratio']}; " if counts_tokens(run.get("task")) else ""
        lines.append(f"shardinfer: {speed_in_this_run(summary, since)}; {padding}{', '.join(run['devices'])}, "
                     f"{run['dtype']}")
    metrics = summary.get("metrics")
    if metrics:
        lines.append(f"shardinfer: {headline(metrics)}")
    failed = row_errors_line(summary, predictions)
    lines.extend([failed] if failed else [])
    lines.extend(warnings(summary, summary_path, shard_logs))
    if report:
        lines.append("shardinfer: figures and tables: snakemake --report report.zip")
    return lines


def written(output: dict | None) -> str:
    """What the table takes: one file's size, or the parts and their manifest (summary.json's `output`)."""
    if not output:
        return ""
    if output["layout"] == "file":
        return f"; {size_text(output['bytes'])}"
    return f": {output['parts']:,} part{'s' if output['parts'] != 1 else ''}, {size_text(output['bytes'])}, " \
           f"proven by its {output['manifest']}"


def size_text(size: int) -> str:
    """Bytes as a person says them: 812 B, 12.4 MB, 1.6 GB."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size:,} B"


def speed_in_this_run(summary: dict, since: float | None) -> str:
    """The throughput of the shard jobs this run ran (those that started at `since` or later), from
    the first one's start to the last one's end; the summary's own figures when it ran them all. After
    a partial rerun the kept shards' jobs ran in an earlier run: their time is not this run's."""
    run, shards = summary["run"], summary.get("per_shard") or []
    ran = [s for s in shards if since is None or (s.get("started") is not None and s["started"] >= since)]
    if len(ran) == len(shards):
        return f"{throughput(run)} over {run['wall_s']:,.1f} s of shard jobs (first start to last end)"
    kept = f"{len(shards) - len(ran):,} kept from earlier runs"
    if not ran or any(s.get("ended") is None for s in ran):
        return f"no shard job ran in this run ({kept}; each shard's own seconds are in per_shard)"
    wall = max(s["ended"] for s in ran) - min(s["started"] for s in ran)
    rows, real = sum(computed(s, "rows") for s in ran), sum(computed(s, "real_tokens") for s in ran)
    rates = {"task": run.get("task"), "rows_per_s": rows / wall if wall else 0.0,
             "real_tokens_per_s": real / wall if wall else 0.0}
    for name in task_totals(run.get("task")):
        if any(name in s for s in ran):
            rates[f"{name}_per_s"] = sum(computed(s, name) for s in ran) / wall if wall else 0.0
    return (f"{len(ran):,} of {len(shards):,} shards ran in this run ({kept}): {throughput(rates)} over "
            f"{wall:,.1f} s of this run's shard jobs (first start to last end)")


def throughput(run: dict) -> str:
    """rows/s, and for the text tasks tokens/s (and their task's running totals per second:
    generated tokens/s)."""
    text = f"{run['rows_per_s']:,.1f} rows/s"
    if not counts_tokens(run.get("task")):
        return text
    text += f", {run['real_tokens_per_s']:,.0f} tokens/s"
    for name, rate in task_totals(run.get("task")).items():
        if run.get(f"{name}_per_s") is not None:
            text += f", {run[f'{name}_per_s']:,.1f} {rate}"
    return text


def unscored_gold(metrics: dict, summary_path: str) -> str | None:
    """The warning for gold values left unscored (null, or labels the model does not know), if any."""
    nulls, unknown = metrics.get("null") or 0, metrics.get("unknown") or 0
    if not nulls and not unknown:
        return None
    parts = [f"{nulls:,} null"] if nulls else []
    if unknown:
        shown = metrics.get("unknown_labels") or []
        more = ", ..." if sum(entry["rows"] for entry in shown) < unknown else ""  # beyond the ones named
        parts.append(f"{unknown:,} not among the model's labels "
                     f"({', '.join(repr(entry['value']) for entry in shown)}{more})")
    return (f"shardinfer: WARNING {nulls + unknown:,} of {metrics['rows']:,} gold values in "
            f"`{metrics['label_column']}` were not scored: {' and '.join(parts)}; see {summary_path} (metrics)")


def warnings(summary: dict, summary_path: str, shard_logs: str) -> Iterator[str]:
    """What a user must not miss: truncated texts, gold values left unscored and a run that used no GPU."""
    run = summary.get("run") or {}
    if not summary["rows"]:
        yield (f"shardinfer: WARNING the input had no rows ({summary.get('input')}): the table holds its columns "
               "and no row")
    unscored = unscored_gold(summary["metrics"], summary_path) if summary.get("metrics") else None
    if unscored:
        yield unscored
    if summary.get("truncated"):
        first = run_first_rows(summary["per_shard"], "first_truncated_rows", "truncated")
        max_length = run.get("max_length") or (summary.get("model") or {}).get("max_length")
        yield (f"shardinfer: WARNING {summary['truncated']:,} of {summary['rows']:,} texts were longer than "
               f"max_length={max_length} tokens and were truncated (first rows: {', '.join(map(str, first))}); "
               f"each shard's first ones are in {summary_path} (per_shard: first_truncated_rows) and {shard_logs}")
    devices = run.get("devices") or []
    if devices and all(device.startswith("cpu") for device in devices):
        yield ("shardinfer: WARNING no GPU was used: every shard ran on the CPU (no CUDA device was visible to "
               "the jobs)")


def failed_rows(summary: dict) -> tuple[int, list[int]]:
    """Rows that failed and were recorded (row_errors: record) over all shards, and the first ones."""
    shards = summary.get("per_shard") or []
    count = sum(shard.get("row_errors") or 0 for shard in shards)
    return count, run_first_rows(shards, "first_row_errors", "row_errors")


def run_first_rows(shards: list[dict], rows_key: str, count_key: str, wanted: int = 10) -> list[int]:
    """The run's first rows of a kind (truncated, failed) from each shard's first ones (`shards` in
    input order, as gather lists them): a shard that listed fewer than it counted hides rows
    before the next shard's, so none after it is taken."""
    first: list[int] = []
    for shard in shards:
        listed = sorted(shard.get(rows_key) or [])
        first.extend(listed)
        if len(first) >= wanted or len(listed) < (shard.get(count_key) or 0):
            break
    return first[:wanted]


def row_errors_line(summary: dict, predictions: str) -> str | None:
    """The warning for rows whose prediction failed and was recorded (row_errors: record), if any."""
    count, first = failed_rows(summary)
    if not count:
        return None
    return (f"shardinfer: WARNING {count:,} of {summary['rows']:,} rows failed (first rows: "
            f"{', '.join(map(str, first))}); their `error` column says why: {predictions}")
