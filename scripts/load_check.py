"""Load check: a 1,000,000-row input through a tiny model on CPU in 64 shards, and a
10,000-shard plan's DAG. Prints wall times, the gather step's peak memory, and the proof.

    .venv/bin/python scripts/load_check.py [workdir] [--rows N] [--shards K]

Builds its tiny model and input under `workdir` (default /tmp/shardinfer-load); nothing is downloaded.
"""

import argparse
import csv
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import factory  # noqa: E402


def timed(label: str, function, *args):
    started = time.perf_counter()
    result = function(*args)
    print(f"{label}: {time.perf_counter() - started:.1f} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="?", default="/tmp/shardinfer-load", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--dag-shards", type=int, default=10_000)
    args = parser.parse_args()
    models = timed("build tiny models", factory.build_tiny_models, args.workdir / "models")
    frame = factory.input_frame(args.rows, seed=1)
    path = timed(f"write {args.rows} rows", factory.write_input, frame, args.workdir / "run" / "data" / "input.parquet")

    dag_config = factory.workflow_config(path, models.classifier, shards=args.dag_shards)
    result = timed(f"snakemake -n with {args.dag_shards} shards", factory.run_workflow, args.workdir / "dag", dag_config, "-n", "-q")
    assert result.returncode == 0, result.stderr[-2000:]

    config = factory.workflow_config(path, models.classifier, shards=args.shards,
                                     batch={"max_tokens": 8192, "max_rows": 256, "sort_window": 16384})
    run = lambda: factory.run_workflow(args.workdir / "run", config, timeout=4 * 3600)  # noqa: E731
    result = timed(f"workflow, {args.rows} rows, {args.shards} shards", run)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = factory.read_predictions(args.workdir / "run")
    assert table["index"].tolist() == list(range(args.rows)) and table["id"].tolist() == frame["id"].tolist()
    print(f"proof re-checked here: {len(table)} rows, index 0..{args.rows - 1} in order, ids match the input")
    with open(args.workdir / "run" / "logs" / "gather.benchmark.tsv") as handle:
        gather = next(csv.DictReader(handle, delimiter="\t"))
    print(f"gather: {float(gather['s']):.1f} s, peak RSS {float(gather['max_rss']):.0f} MB")


if __name__ == "__main__":
    main()
