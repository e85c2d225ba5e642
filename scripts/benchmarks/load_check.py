"""Load check: bytes read by 64 shards of a 1 GB input in each format, a 1,000,000-row input
through a tiny model on CPU in 64 shards, and a 10,000-shard plan's DAG. Prints wall times, the
gather step's peak memory, the proof, and the workflow's own overhead as a share of the wall time.

DAG: `snakemake -n` with --dag-shards shards, of the workflow and of a bare Snakefile with the same
rules and directives but trivial values (`benchmarks.dag`), in turns, best of two each; the ratio is
the workflow's own Snakemake overhead per shard job.

Bytes read (`benchmarks.reads`): the script writes one table of about --read-gb GB in every input format (the registry,
`shardinfer.input.formats`, each by its own `Format.write`, in blocks of about 64 MiB), gzipped too
for each format that may be compressed, and as a Parquet file of one row group (what pandas writes);
it plans each into --shards ranges (staging the gzipped files and the one-group Parquet file, as the
plan rule does: `shardinfer.input.staging`) and reads every range as a shard job does
(`parts.iter_pieces` with the plan's spans, from the staged copy), in this process, counting what it
reads; a staged file is also read in place by all shards, as it would be without its copy. rchar
counts read calls: the pages a format reads memory-mapped (Arrow IPC, hf_dataset) are not in it.

Bytes downloaded: without a shared filesystem a shard job downloads the plan file and its own cut of
the input, which the plan writes (`shardinfer.input.shard_cuts`); for each format the script plans
the same file so, and prints each shard job's bytes and all of them together against the input;
then what each shard job downloads of the model besides (the demo's, as rule stage_model stages it).

Overhead is everything that is not shard work: wall time minus the shard jobs' summed time
(Snakemake's `benchmark:` of each infer job, start-up and model load included) divided by the
jobs that run at once (--cores 2, one thread per shard job). It holds plan, gather, the report
items, Snakemake's scheduling and job launching, and any idle slot at the end.

    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.load_check [workdir] [--rows N] [--shards K]
        [--read-gb G] [--dag-shards D] [--skip-run]

Builds its tiny model and input under `workdir` (default /tmp/shardinfer-load); nothing is downloaded.
"""

import argparse
import json
from pathlib import Path

import tiny_workflow as tiny
from benchmarks.dag import check_dag
from benchmarks.reads import report_reads
from benchmarks.timing import benchmark_row, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="?", default="/tmp/shardinfer-load", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--dag-shards", type=int, default=10_000, help="0 skips the DAG check")
    parser.add_argument("--read-gb", type=float, default=1.0, help="size of the bytes-read inputs; 0 skips them")
    parser.add_argument("--skip-run", action="store_true", help="skip the --rows workflow run")
    args = parser.parse_args()
    if args.read_gb:
        report_reads(args.workdir / "reads", args.read_gb, args.shards)
    if args.dag_shards or not args.skip_run:
        check_dag_and_run(args)


def check_dag_and_run(args: argparse.Namespace) -> None:
    models = timed("build tiny models", tiny.build_tiny_models, args.workdir / "models")
    if args.dag_shards:
        check_dag(args.workdir / "dag", models.classifier, args.dag_shards)

    if args.skip_run:
        return
    frame = tiny.input_frame(args.rows, seed=1)
    path = timed(f"write {args.rows} rows", tiny.write_input, frame, args.workdir / "run" / "data" / "input.parquet")
    config = tiny.workflow_config(path, models.classifier, shards=args.shards,
                                     batch={"max_tokens": 8192, "max_rows": 256, "sort_window": 16384})
    run = lambda: tiny.run_workflow(args.workdir / "run", config, timeout=4 * 3600)  # noqa: E731
    result = timed(f"workflow, {args.rows} rows, {args.shards} shards", run)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = tiny.read_predictions(args.workdir / "run")
    assert table["index"].tolist() == list(range(args.rows)) and table["id"].tolist() == frame["id"].tolist()
    print(f"proof re-checked here: {len(table)} rows, index 0..{args.rows - 1} in order, ids match the input")
    logs = args.workdir / "run" / "logs"
    gather = benchmark_row(logs / "gather.benchmark.tsv")
    print(f"gather: {float(gather['s']):.1f} s, peak RSS {float(gather['max_rss']):.0f} MB")
    report_overhead(args.workdir / "run", wall=result.wall_s, slots=2)


def report_overhead(workdir: Path, wall: float, slots: int) -> None:
    """Wall time against the shard jobs' own time packed into `slots` concurrent jobs."""
    logs = workdir / "logs"
    plan_s = float(benchmark_row(logs / "plan.benchmark.tsv")["s"])
    gather_s = float(benchmark_row(logs / "gather.benchmark.tsv")["s"])
    report_s = float(benchmark_row(logs / "report.benchmark.tsv")["s"])
    jobs_s = sum(float(benchmark_row(p)["s"]) for p in (logs / "infer").glob("*.benchmark.tsv"))
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
