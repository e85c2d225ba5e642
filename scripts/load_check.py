"""Load check: a 1,000,000-row input through a tiny model on CPU in 64 shards, and a
10,000-shard plan's DAG. Prints wall times, the gather step's peak memory, the proof, and the
workflow's own overhead as a share of the wall time.

Overhead is everything that is not shard work: wall time minus the shard jobs' summed time
(Snakemake's `benchmark:` of each infer job, start-up and model load included) divided by the
jobs that run at once (--cores 2, one thread per shard job). It holds plan, gather, the report
items, Snakemake's scheduling and job launching, and any idle slot at the end.

    .venv/bin/python scripts/load_check.py [workdir] [--rows N] [--shards K]

Builds its tiny model and input under `workdir` (default /tmp/shardinfer-load); nothing is downloaded.
"""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import factory  # noqa: E402


def timed(label: str, function, *args):
    started = time.perf_counter()
    result = function(*args)
    seconds = time.perf_counter() - started
    print(f"{label}: {seconds:.1f} s", flush=True)
    if hasattr(result, "returncode"):
        result.wall_s = seconds
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="?", default="/tmp/shardinfer-load", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--dag-shards", type=int, default=10_000, help="0 skips the DAG check")
    args = parser.parse_args()
    models = timed("build tiny models", factory.build_tiny_models, args.workdir / "models")
    frame = factory.input_frame(args.rows, seed=1)
    path = timed(f"write {args.rows} rows", factory.write_input, frame, args.workdir / "run" / "data" / "input.parquet")

    if args.dag_shards:
        dag_config = factory.workflow_config(path, models.classifier, shards=args.dag_shards)
        result = timed(f"snakemake -n with {args.dag_shards} shards", factory.run_workflow, args.workdir / "dag",
                       dag_config, "-n", "-q")
        assert result.returncode == 0, result.stderr[-2000:]

    config = factory.workflow_config(path, models.classifier, shards=args.shards,
                                     batch={"max_tokens": 8192, "max_rows": 256, "sort_window": 16384})
    run = lambda: factory.run_workflow(args.workdir / "run", config, timeout=4 * 3600)  # noqa: E731
    result = timed(f"workflow, {args.rows} rows, {args.shards} shards", run)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = factory.read_predictions(args.workdir / "run")
    assert table["index"].tolist() == list(range(args.rows)) and table["id"].tolist() == frame["id"].tolist()
    print(f"proof re-checked here: {len(table)} rows, index 0..{args.rows - 1} in order, ids match the input")
    logs = args.workdir / "run" / "logs"
    gather = benchmark_of(logs / "gather.benchmark.tsv")
    print(f"gather: {float(gather['s']):.1f} s, peak RSS {float(gather['max_rss']):.0f} MB")
    report_overhead(args.workdir / "run", wall=result.wall_s, slots=2)


def benchmark_of(path: Path) -> dict:
    with open(path) as handle:
        return next(csv.DictReader(handle, delimiter="\t"))


def report_overhead(workdir: Path, wall: float, slots: int) -> None:
    """Wall time against the shard jobs' own time packed into `slots` concurrent jobs."""
    logs = workdir / "logs"
    plan_s = float(benchmark_of(logs / "plan.benchmark.tsv")["s"])
    gather_s = float(benchmark_of(logs / "gather.benchmark.tsv")["s"])
    report_s = float(benchmark_of(logs / "report.benchmark.tsv")["s"])
    jobs_s = sum(float(benchmark_of(p)["s"]) for p in (logs / "infer").glob("*.benchmark.tsv"))
    summary = json.loads((workdir / "results" / "summary.json").read_text())
    work_s = sum(s["seconds"] for s in summary["per_shard"])
    overhead = wall - jobs_s / slots
    print(f"wall {wall:.1f} s; shard jobs {jobs_s:.1f} s in all ({work_s:.1f} s of it reading, inferring and "
          f"writing, {jobs_s - work_s:.1f} s starting Python, loading the model), {slots} at a time")
    print(f"overhead (wall - shard jobs / {slots}): {overhead:.1f} s = {overhead / wall:.1%} of the wall time; "
          f"of it plan {plan_s:.1f} s, gather {gather_s:.1f} s, report items {report_s:.1f} s, "
          f"scheduling and idle {overhead - plan_s - gather_s - report_s:.1f} s")
    bounds = {}
    for shard in summary["per_shard"]:
        bounds[shard["bound_by"]] = bounds.get(shard["bound_by"], 0) + 1
    print(f"padding ratio {summary['padding_ratio']}; shards bound by: {bounds}")


if __name__ == "__main__":
    main()
