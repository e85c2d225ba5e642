"""The few lines a user reads on the terminal after a successful run, made from results/summary.json.

Logs hold everything; these lines say what a user must know without opening them: how many rows
were written where, how fast, what was truncated (and where to see which), the headline scores
against the gold labels (`evaluate:`), and warnings such as a run that fell back to the CPU or gold
values left unscored. Free of torch: the Snakefile's `onsuccess` handler calls it.
"""

from __future__ import annotations

from typing import Iterator


def summary_lines(summary: dict, predictions: str, summary_path: str, shard_logs: str = "logs/infer/<shard>.log",
                  report: bool = True) -> list[str]:
    """One line each: rows written, throughput, then truncation and warnings when there are any, and
    (`report`) where the figures are; `shard_logs` names the shard logs the truncation warning points to."""
    run = summary.get("run") or {}
    rows, shards = summary["rows"], summary["shards"]
    lines = [f"shardinfer: {rows:,} rows written to {predictions}, proven complete and in input order "
             f"({shards} shard{'s' if shards != 1 else ''}, index 0..{rows - 1})"]
    if run.get("rows_per_s") is not None:
        padding = "" if run.get("task") == "custom" else f"padding ratio {run['padding_ratio']}; "
        lines.append(f"shardinfer: {throughput(run)} over {run['wall_s']:,.1f} s of shard jobs (first start to last "
                     f"end); {padding}{', '.join(run['devices'])}, {run['dtype']}")
    metrics = summary.get("metrics")
    if metrics:
        lines.append(f"shardinfer: {headline(metrics)}")
    lines.extend(warnings(summary, summary_path, shard_logs))
    if report:
        lines.append("shardinfer: figures and tables: snakemake --report report.zip")
    return lines


def throughput(run: dict) -> str:
    """rows/s, and for the text tasks tokens/s (and generated tokens/s)."""
    text = f"{run['rows_per_s']:,.1f} rows/s"
    if run.get("task") == "custom":
        return text
    text += f", {run['real_tokens_per_s']:,.0f} tokens/s"
    if run.get("generated_tokens_per_s") is not None:
        text += f", {run['generated_tokens_per_s']:,.1f} generated tokens/s"
    return text


def headline(metrics: dict) -> str:
    """The scores a user looks for first (`evaluate:`): accuracy and macro F1, or exact match."""
    if metrics["scored"] == 0:
        return f"nothing scored: no row of `{metrics['label_column']}` holds a gold value the model knows"
    against = f"over {metrics['scored']:,} rows scored against `{metrics['label_column']}`"
    if "exact_match" in metrics:
        return (f"exact match {metrics['exact_match']:.4f} (normalized {metrics['normalized_exact_match']:.4f}) "
                f"{against}")
    return (f"accuracy {metrics['accuracy']:.4f}, macro F1 {metrics['macro_f1']:.4f} {against} "
            f"({metrics['compared_with']})")


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
    unscored = unscored_gold(summary["metrics"], summary_path) if summary.get("metrics") else None
    if unscored:
        yield unscored
    if summary.get("truncated"):
        first = sorted(row for shard in summary["per_shard"] for row in shard.get("first_truncated_rows") or [])
        max_length = run.get("max_length") or (summary.get("model") or {}).get("max_length")
        yield (f"shardinfer: WARNING {summary['truncated']:,} of {summary['rows']:,} texts were longer than "
               f"max_length={max_length} tokens and were truncated (first rows: {', '.join(map(str, first[:10]))}); "
               f"each shard's first ones are in {summary_path} (per_shard: first_truncated_rows) and {shard_logs}")
    devices = run.get("devices") or []
    if devices and all(device.startswith("cpu") for device in devices):
        yield ("shardinfer: WARNING no GPU was used: every shard ran on the CPU (no CUDA device was visible to "
               "the jobs)")
