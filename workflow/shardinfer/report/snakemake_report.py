"""The items of `snakemake --report`: two tables and three figures made from results/summary.json,
and with `evaluate:` a table of the scores and (classify) a confusion-matrix figure.

The rule runs at the end of every run, so it must cost next to nothing: it reads only the summary
gather wrote (no shard file, no torch), and imports matplotlib inside the plotting functions,
without pyplot (a bare Agg figure: no GUI backend, no global state). Figures are PNG at a modest
dpi: they embed in Snakemake's self-contained report as they are.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import dataclass
from datetime import datetime
from html import escape
from pathlib import Path

from shardinfer.contract.shard_file import computed
from shardinfer.core.errors import UserError
from shardinfer.report.terminal import failed_rows
from shardinfer.tasks import counts_tokens

log = logging.getLogger(__name__)

DPI = 100
SIZE = (8.0, 4.0)  # inches: 800 x 400 pixels at DPI
CONFUSION_SIZE = (6.0, 5.0)  # inches: a square matrix, its colour bar beside it
ANNOTATED = 20  # classes up to which each cell of the confusion matrix shows its count
TICKED = 40  # classes up to which each is named on the axes
STAGES = ("read", "tokenize", "read tokens", "prepare", "batch", "device", "write")  # the order a row goes through
STRAGGLER = 0.75  # a shard under this share of the median rows/s is drawn in red
MAX_BARS = 200  # more shards than this: each series is one filled outline, not a rectangle per shard
SHARD_COLUMNS = ["shard", "range", "rows", "real tokens", "seconds", "rows/s", "load s", "padding ratio",
                 "bound by", "device"]
# What only a task whose rows are texts in tokens has (`Reporting.counts_tokens`): left out for the others.
TOKEN_COLUMNS = ("real tokens", "padding ratio")
TOKEN_FACTS = ("real tokens/s over the wall time", "real tokens", "padding ratio (tokens computed / real tokens)",
               "rows truncated")
PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title><style>
body {{ font-family: sans-serif; font-size: 14px; margin: 1em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
th {{ background: #f3f3f3; }} td.number {{ text-align: right; }}
</style></head><body><h3>{title}</h3>
<table>
{rows}</table>
</body></html>
"""


@dataclass(frozen=True)
class ReportFiles:
    """Where each item goes (the rule's outputs, by the same names)."""

    run: str  # HTML: the run at a glance
    shards: str  # HTML: one row per shard
    rows_per_s: str  # PNG: rows/s per shard, stragglers in red
    stages: str  # PNG: busy seconds per pipeline stage, stacked per shard
    token_lengths: str | None = None  # PNG: rows per token length, max_length marked (None: not a text task)
    metrics: str | None = None  # HTML: the scores against the gold labels (`evaluate:`; None when off)
    confusion: str | None = None  # PNG: the confusion matrix (`evaluate:` on a task scored against labels)


def rows_per_s(shard: dict) -> float | None:
    """A shard's own throughput: the rows its job computed over its work seconds (model load excluded)."""
    seconds = shard.get("seconds")
    return computed(shard, "rows") / seconds if seconds else None


def load_seconds(shard: dict) -> float | None:
    """Seconds from the shard job's start to its first row (device lease, model load): the fixed
    price each shard pays, which docs/performance.md says to keep small next to the shard's work."""
    if None in (shard.get("started"), shard.get("ended"), shard.get("seconds")):
        return None
    return max(shard["ended"] - shard["started"] - shard["seconds"], 0.0)


def local_time(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def run_rows(summary: dict) -> list[list]:
    """(what, value) pairs for the run at a glance; rates are over the wall time, start-up included."""
    run = summary["run"]
    model = show(run.get("model")) + (f" + adapter {run['adapter']}" if run.get("adapter") else "")
    truncated = f"{run['truncated']:,} (cut at max_length {run['max_length']})"
    rows = [
        ["rows", run["rows"]], ["shards", run["shards"]], ["task", run["task"]], ["model", model],
        ["devices", "; ".join(run["devices"])], ["dtype", run["dtype"]],
        ["started", local_time(run["started"])], ["ended", local_time(run["ended"])],
        ["wall time, s (first shard job's start to last shard's end, in whichever runs made them)", run["wall_s"]],
        ["rows/s over the wall time", run["rows_per_s"]],
        ["real tokens/s over the wall time", run["real_tokens_per_s"]],
        ["real tokens", run["real_tokens"]], ["padding ratio (tokens computed / real tokens)", run["padding_ratio"]],
        ["rows truncated", truncated], *failed_rows_item(summary), ["input", summary.get("input")],
        ["plan id", summary.get("plan_id")],
    ]
    return rows if counts_tokens(run.get("task")) else [row for row in rows if row[0] not in TOKEN_FACTS]


def failed_rows_item(summary: dict) -> list[list]:
    """With row_errors: record, the rows that failed: how many, the first, and where they are."""
    count, first = failed_rows(summary)
    if not any("row_errors" in shard for shard in summary.get("per_shard") or []):
        return []
    where = f" (first rows: {', '.join(map(str, first))}; non-null `error` in the predictions)" if count else ""
    return [["rows failed (row_errors: record)", f"{count:,}{where}"]]


def shard_columns(summary: dict) -> list[str]:
    """The shard table's columns: SHARD_COLUMNS, those in tokens only for a task that counts them."""
    tokens = counts_tokens(summary["run"].get("task"))
    return [name for name in SHARD_COLUMNS if tokens or name not in TOKEN_COLUMNS]


def shard_rows(summary: dict) -> list[list]:
    """One row per shard, in `shard_columns` order."""
    shown = [SHARD_COLUMNS.index(name) for name in shard_columns(summary)]
    rows = [[s["shard"], f"[{s['start']:,}, {s['end']:,})", s["rows"], s.get("real_tokens"), s.get("seconds"),
             rows_per_s(s), load_seconds(s), s.get("padding_ratio"), s.get("bound_by"), s.get("device")]
            for s in summary["per_shard"]]
    return [[row[k] for k in shown] for row in rows]


def show(value) -> str:
    """A cell's text: four significant digits below 1,000 (a padding ratio of 1.004 stays
    visible), whole numbers with thousands separated above, a dash for unknown."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def html_table(title: str, rows: list[list], header: list[str] | None = None) -> str:
    """A standalone HTML page holding one table (the report shows HTML items as they are)."""
    def cell(value) -> str:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return f'<td class="number">{show(value)}</td>' if number else f"<td>{escape(show(value))}</td>"

    lines = ["<tr>" + "".join(f"<th>{escape(name)}</th>" for name in header) + "</tr>\n"] if header else []
    lines += ["<tr>" + "".join(cell(value) for value in row) + "</tr>\n" for row in rows]
    return PAGE.format(title=escape(title), rows="".join(lines))


def figure(title: str, xlabel: str, ylabel: str, size: tuple[float, float] = SIZE):
    """A bare Agg figure and its axes; matplotlib is imported here, only when a figure is drawn."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")  # room for labels and legend, whatever their size
    axes = fig.add_subplot()
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig, axes


def save(fig, path: str, from_zero: bool = True) -> None:
    """Every plot counts from zero (`from_zero`; not a matrix); the top stays where autoscaling put it."""
    for axes in fig.axes if from_zero else ():
        axes.set_ylim(bottom=0)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)


def legend(axes) -> None:
    """Outside the axes, on the right: it never hides a bar, and placing it costs no search."""
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))


def shard_axis(axes, shards: int) -> None:
    """Whole shard numbers on the x axis, however many shards."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlim(-0.6, shards - 0.4)


def bars(axes, values: list[float], bottom: list[float], **style) -> None:
    """A bar per shard; past MAX_BARS shards one filled step outline per series, which draws
    10,000 shards as fast as 10 (thousands of rectangles would cost seconds in every run)."""
    if len(values) <= MAX_BARS:
        axes.bar(range(len(values)), values, bottom=bottom, width=0.8, **style)
        return
    tops = [b + v for b, v in zip(bottom, values)]
    edges = [i - 0.5 for i in range(len(values) + 1)]
    axes.fill_between(edges, bottom + bottom[-1:], tops + tops[-1:], step="post", linewidth=0, **style)


def plot_rows_per_s(shards: list[dict], path: str) -> None:
    """Bars of rows/s per shard against the median: a straggler (slow device, long texts) stands out."""
    rates = [rows_per_s(s) or 0.0 for s in shards]
    median = statistics.median(rates)
    slow = [rate < STRAGGLER * median for rate in rates]
    fig, axes = figure("Rows/s per shard", "shard", "rows/s (work seconds, model load excluded)")
    zero = [0.0] * len(rates)
    bars(axes, [0.0 if s else r for r, s in zip(rates, slow)], zero, color="C0")
    if any(slow):
        bars(axes, [r if s else 0.0 for r, s in zip(rates, slow)], zero, color="C3",
             label=f"under {STRAGGLER:.0%} of the median")
    axes.axhline(median, color="black", linestyle="--", linewidth=1, label=f"median {show(median)} rows/s")
    legend(axes)
    shard_axis(axes, len(rates))
    save(fig, path)


def stage_names(shards: list[dict]) -> list[str]:
    """Every stage named in any shard, in the order a row goes through them (a stage this module
    does not know goes last), so the stack reads bottom to top like the pipeline."""
    names = {name for shard in shards for name in shard.get("stages") or {}}
    return sorted(names, key=lambda name: (STAGES.index(name) if name in STAGES else len(STAGES), name))


def plot_stages(shards: list[dict], path: str) -> None:
    """Each shard's busy seconds per stage, stacked. Stages overlap in time, so the stack can pass
    the shard's own seconds (the black tick); the tallest part is the stage that bounds it."""
    fig, axes = figure("Time per pipeline stage", "shard", "busy seconds")
    bottom = [0.0] * len(shards)
    for name in stage_names(shards):
        values = [(s.get("stages") or {}).get(name, 0.0) for s in shards]
        bars(axes, values, bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    if len(shards) <= MAX_BARS:  # past that, ticks would hide the bars
        seconds = [s.get("seconds") or 0.0 for s in shards]
        axes.plot(range(len(shards)), seconds, "_", color="black", markersize=12, label="shard seconds")
    legend(axes)
    shard_axis(axes, len(shards))
    save(fig, path)


def plot_token_lengths(lengths: dict[str, int], max_length: int | None, truncated: int, path: str) -> None:
    """Rows per real token length (after truncation, so cut texts pile up at max_length): whether
    max_length suits the data, and how much a batch of mixed lengths would pad."""
    counts = {int(length): rows for length, rows in lengths.items()}
    title = "Text lengths in tokens"
    if max_length:
        title += f" (dashed: max_length {max_length}; {truncated:,} rows truncated)"
    fig, axes = figure(title, "tokens per row (special tokens included)", "rows")
    if counts:  # a filled step outline: as fast for max_length 8192 as for 32
        values = [counts.get(n, 0) for n in range(1, max(max(counts), max_length or 0) + 1)]
        edges = [n + 0.5 for n in range(len(values) + 1)]
        axes.fill_between(edges, values + values[-1:], step="post", linewidth=0, color="C0")
    if max_length:
        axes.axvline(max_length, color="C3", linestyle="--", linewidth=1.5)
    save(fig, path)


def metrics_title(metrics: dict) -> str:
    """What was scored against what, and what was not (null or unknown gold values)."""
    title = (f"Scores against `{metrics['label_column']}` ({metrics['compared_with']}): "
             f"{metrics['scored']:,} of {metrics['rows']:,} rows scored")
    if metrics.get("null") or metrics.get("unknown"):
        nulls, unknown = metrics.get("null") or 0, metrics.get("unknown") or 0
        title += f"; not scored: {nulls:,} null, {unknown:,} unknown to the model"
        shown = metrics.get("unknown_labels") or []
        title += f" ({', '.join(repr(entry['value']) for entry in shown)})" if shown else ""
    return title


def metrics_rows(metrics: dict) -> tuple[list[str], list[list]]:
    """The scores as a table: per class, then accuracy and the averages, as scikit-learn's
    classification_report lays them out; for exact match, one row per score."""
    if "exact_match" in metrics:
        return ["score", "value"], [["exact match", metrics["exact_match"]],
                                    ["normalized exact match", metrics["normalized_exact_match"]]]
    rows = [[c["label"], c["precision"], c["recall"], c["f1"], c["support"]] for c in metrics["per_class"]]
    rows.append(["accuracy", None, None, metrics["accuracy"], metrics["scored"]])
    for average in ("macro", "weighted"):
        rows.append([f"{average} avg", metrics.get(f"{average}_precision"), metrics.get(f"{average}_recall"),
                     metrics.get(f"{average}_f1"), metrics["scored"]])
    return ["class", "precision", "recall", "F1", "support"], rows


def plot_confusion(confusion: dict, path: str) -> None:
    """Rows scored per (gold, predicted) pair, the diagonal being the right answers: which classes
    the model mixes up. Counts in the cells up to ANNOTATED classes, names on the axes up to TICKED."""
    labels, matrix = confusion["labels"], confusion["matrix"]
    fig, axes = figure("Confusion matrix (rows scored)", "predicted label", "gold label", CONFUSION_SIZE)
    image = axes.imshow(matrix or [[0]], cmap="Blues", interpolation="nearest", aspect="auto")
    fig.colorbar(image, ax=axes, label="rows")
    if len(labels) <= TICKED:
        slanted = len(labels) > 5  # longer rows of names are slanted so that they do not overlap
        axes.set_xticks(range(len(labels)), labels, rotation=45 if slanted else 0, ha="right" if slanted else "center")
        axes.set_yticks(range(len(labels)), labels)
    if len(labels) <= ANNOTATED:
        top = max((max(row) for row in matrix), default=0)
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                axes.text(j, i, f"{count:,}", ha="center", va="center", color="white" if count > top / 2 else "black")
    save(fig, path, from_zero=False)


def write_metrics(metrics: dict | None, files: ReportFiles) -> None:
    """The `evaluate:` items the rule asks for: the scores' table, and the confusion matrix."""
    if files.metrics is None and files.confusion is None:
        return
    if not metrics:
        raise UserError("summary.json has no `metrics` though evaluate.label_column is set; rerun gather with "
                        "`snakemake --forcerun gather`")
    header, rows = metrics_rows(metrics)
    Path(files.metrics).parent.mkdir(parents=True, exist_ok=True)
    Path(files.metrics).write_text(html_table(metrics_title(metrics), rows, header))
    if files.confusion is not None:
        plot_confusion(metrics["confusion"], files.confusion)


def read_summary(path: str) -> dict:
    summary = json.loads(Path(path).read_text())
    if "run" not in summary:
        raise UserError(f"`{path}` was written by an earlier version of gather (no `run` block); "
                        "rerun it with `snakemake --forcerun gather`")
    return summary


def write_report(summary_path: str, files: ReportFiles) -> None:
    """The report rule: both tables and the three figures from the run's summary."""
    summary = read_summary(summary_path)
    run, shards = summary["run"], summary["per_shard"]
    for path, page in ((files.run, html_table("Run at a glance", run_rows(summary))),
                       (files.shards, html_table("Shards", shard_rows(summary), shard_columns(summary)))):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(page)
    plot_rows_per_s(shards, files.rows_per_s)
    plot_stages(shards, files.stages)
    if files.token_lengths is not None:  # a task whose rows are texts in tokens (report.smk asks for it then)
        plot_token_lengths(summary.get("token_lengths") or {}, run["max_length"], run["truncated"],
                           files.token_lengths)
    write_metrics(summary.get("metrics"), files)
    log.info("wrote the report items for %d shards: %s", len(shards), ", ".join(filter(None, vars(files).values())))
