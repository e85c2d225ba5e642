"""Scale benchmark: the whole workflow at millions of rows with a trivial model, so that what is
measured is the pipeline (plan, scheduling, writing, gather), not inference.

    export PYTHONPATH=workflow:scripts       # in the clone's folder
    .venv/bin/python -m benchmarks.scale --rows 1000000 --width 384 --shards 4
    .venv/bin/python -m benchmarks.scale --rows 1000000 4000000 16000000 --width 0 --shards 2
    .venv/bin/python -m benchmarks.scale --rows 1000000 --width 384 --workflow /path/to/other/clone

`task: custom` with a hook that returns, per row, its text's length as one int64 (`--width 0`,
narrow) or that and `--width` random float32 values (an embedding's size). Each size runs once per
layout (`output.layout: file`, then `parts`) as a user runs it: `snakemake --cores 2 --set-threads
infer=1` in a folder of its own, the shard count given. It prints, per run: plan, shard (the longest
shard job) and gather seconds from the rules' benchmark files, the whole run's seconds, gather's
peak memory (its benchmark's max_rss), and the CPU seconds of plan, the busiest shard job and gather
(their cpu_time: on a shared machine the wall seconds grow with the others' load, the CPU seconds
much less), the bytes on disk under results/ (hard links counted once) against the values' bytes
(the shards' files), and the pipeline's overhead: the run less the span of its shard jobs (first
start to last end, from their benchmark files; a job's start-up, the hook's work and writing are the
shards' own), as a share of the run: planning, gathering, Snakemake's own start and scheduling.
`--gather-repeats N` runs gather alone N more times (`--forcerun gather`) and keeps its fastest, for
a machine whose other load comes and goes. Then how each grows from the smallest size to the
largest.

`--workflow` runs another clone's Snakefile (an older version: its one-file layout, for a baseline
on the same machine); the layouts it lacks are skipped. Runs are left in `--work` (default a folder
under the system's temporary folder) unless `--clean`; each size's input is made once and kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks import REPO
from benchmarks.timing import benchmark_row

HOOK = '''
import numpy as np
import pyarrow.compute as pc


class Fixed:
    """The text's length, and (width > 0) `width` random float32 values per row."""

    def __init__(self, width):
        self.width = width
        self.outputs = {"length": "int64", **({"vector": "list<float32>"} if width else {})}

    def predict(self, batch, index):
        out = {"length": pc.utf8_length(batch.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)}
        if self.width:
            out["vector"] = np.random.default_rng(int(index[0])).random((len(index), self.width), dtype=np.float32)
        return out


def build(model_path, options, device):
    return Fixed(int(options["width"]))
'''


def make_input(path: Path, rows: int) -> Path:
    """`rows` short texts (5 to 45 characters), in row groups of 1M rows."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        for start in range(0, rows, 1_000_000):
            count = min(1_000_000, rows - start)
            picked = words[np.arange(start, start + count) % len(words)]
            repeat = 1 + np.arange(start, start + count) % 5
            texts = [" ".join([word] * times) for word, times in zip(picked.tolist(), repeat.tolist())]
            writer.write_table(pa.table({"text": texts}))
    return path


def config(input_path: Path, width: int, shards: int, layout: str) -> dict:
    values = {"input": {"path": str(input_path), "columns": ["text"]},
              "model": {"task": "custom", "entrypoint": "hook.py:build", "options": {"width": width}},
              "shards": shards}
    if layout != "file":  # an older clone knows no `output:` section
        values["output"] = {"layout": layout}
    return values


def benchmark_file(path: Path) -> dict:
    """A rule's benchmark: its job's seconds and peak memory, and when it ended (the file's mtime)."""
    row = benchmark_row(path)
    rss = float(row["max_rss"]) if row["max_rss"] not in ("", "NA") else None
    cpu = float(row["cpu_time"]) if row.get("cpu_time") not in (None, "", "NA") else None
    return {"s": float(row["s"]), "max_rss": rss, "cpu_s": cpu, "end": path.stat().st_mtime}


def unique_bytes(folder: Path) -> int:
    """Bytes of the files below `folder`, each inode once (a hard link is no second copy)."""
    seen, total = set(), 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def shard_bytes(folder: Path) -> int:
    """The values: the shard jobs' files (their pieces, through the shard file's link)."""
    return sum(path.stat().st_size for path in (folder / "results" / "shards").iterdir()
               if path.name.endswith((".parquet", ".parquet.data")) and not path.is_symlink())


def gather_again(command: list[str], folder: Path, repeats: int) -> list[dict]:
    """Gather alone, `repeats` times more (`--forcerun gather`): its timings, to take the best of on a
    machine whose other load comes and goes."""
    timings = []
    for _ in range(repeats):
        subprocess.run([*command, "--forcerun", "gather"], cwd=folder, capture_output=True, text=True, check=True)
        timings.append(benchmark_file(folder / "logs" / "gather.benchmark.tsv"))
    return timings


def run(workflow: Path, folder: Path, values: dict, repeats: int = 0) -> dict:
    """One run from scratch in `folder`, then gather `repeats` times more; its figures (gather's the
    fastest of its runs)."""
    shutil.rmtree(folder / "results", ignore_errors=True)
    shutil.rmtree(folder / "logs", ignore_errors=True)
    shutil.rmtree(folder / ".snakemake", ignore_errors=True)
    (folder / "config").mkdir(parents=True, exist_ok=True)
    (folder / "config" / "config.yaml").write_text(yaml.safe_dump(values))
    (folder / "hook.py").write_text(HOOK)
    command = [sys.executable, "-m", "snakemake", "-s", str(workflow), "--cores", "2", "--set-threads", "infer=1",
               "--omit-from", "report_items"]
    began = time.perf_counter()
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    whole = time.perf_counter() - began
    if result.returncode != 0:
        raise RuntimeError(f"the run in {folder} failed:\n{result.stderr[-3000:]}")
    shards = [benchmark_file(path) for path in sorted((folder / "logs" / "infer").glob("*.benchmark.tsv"))]
    gather = benchmark_file(folder / "logs" / "gather.benchmark.tsv")
    gather = min([gather, *gather_again(command, folder, repeats)], key=lambda timing: timing["s"])
    values_bytes = shard_bytes(folder)
    span = max(s["end"] for s in shards) - min(s["end"] - s["s"] for s in shards)
    plan = benchmark_file(folder / "logs" / "plan.benchmark.tsv")
    return {"plan_s": plan["s"], "plan_cpu_s": plan["cpu_s"], "shard_s": max(s["s"] for s in shards),
            "shard_cpu_s": max(s["cpu_s"] or 0.0 for s in shards),
            "gather_s": gather["s"], "gather_cpu_s": gather["cpu_s"], "whole_s": whole,
            "gather_mb": gather["max_rss"],
            "values_bytes": values_bytes, "disk_bytes": unique_bytes(folder / "results"),
            "overhead": (whole - span) / whole, "gather_mb_s": values_bytes / 1e6 / gather["s"]}


def knows_layouts(workflow: Path) -> bool:
    schema = workflow.parent / "workflow" / "schemas" / "config.schema.yaml"
    return "output" in yaml.safe_load(schema.read_text())["properties"]


def table_line(rows: int, width: int, layout: str, shards: int, figures: dict) -> str:
    return (f"| {rows:,} | {width or 'int'} | {layout} | {shards} | {figures['plan_s']:.1f} | "
            f"{figures['plan_cpu_s'] or 0:.1f} | {figures['shard_s']:.1f} | {figures['shard_cpu_s']:.1f} | "
            f"{figures['gather_s']:.2f} | {figures['gather_cpu_s']:.2f} | "
            f"{figures['whole_s']:.1f} | {figures['gather_mb']:.0f} | "
            f"{figures['values_bytes'] / 1e6:,.0f} | {figures['disk_bytes'] / figures['values_bytes']:.2f}x | "
            f"{figures['gather_mb_s']:,.0f} | {100 * figures['overhead']:.1f}% |")


def growth(results: dict) -> list[str]:
    """Per width and layout: each figure at the largest size over the smallest, beside the rows' ratio."""
    lines = []
    for (width, layout), by_rows in results.items():
        sizes = sorted(by_rows)
        if len(sizes) < 2:
            continue
        low, high = by_rows[sizes[0]], by_rows[sizes[-1]]
        ratios = ", ".join(f"{key} x{high[key] / low[key]:.1f}" for key in ("plan_s", "gather_s", "whole_s",
                                                                            "gather_mb", "disk_bytes") if low[key])
        lines.append(f"{width or 'int'}, {layout}: rows x{sizes[-1] / sizes[0]:.0f} -> {ratios}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--width", type=int, default=0, help="float32 values per row beside its length (0: none)")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--layouts", nargs="+", default=["file", "parts"])
    parser.add_argument("--workflow", type=Path, default=REPO, help="the clone whose Snakefile runs")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "shardinfer-scale")
    parser.add_argument("--clean", action="store_true", help="remove each run's results after it")
    parser.add_argument("--gather-repeats", type=int, default=0,
                        help="run gather alone this many times more after each run and keep its fastest")
    args = parser.parse_args()
    workflow = args.workflow.resolve() / "Snakefile"
    layouts = args.layouts if knows_layouts(workflow) else ["file"]
    print("| rows | output | layout | shards | plan s | plan CPU s | longest shard s | shard CPU s | gather s "
          "| gather CPU s | whole run s | gather peak MB | values MB | disk / values | gather MB/s | overhead |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    results: dict = {}
    for rows in args.rows:
        source = make_input(args.work / "inputs" / f"{rows}.parquet", rows)
        for layout in layouts:
            folder = args.work / f"{rows}-{args.width}-{layout}-{args.shards}"
            figures = run(workflow, folder, config(source, args.width, args.shards, layout), args.gather_repeats)
            results.setdefault((args.width, layout), {})[rows] = figures
            print(table_line(rows, args.width, layout, args.shards, figures), flush=True)
            if args.clean:
                shutil.rmtree(folder / "results", ignore_errors=True)
    for line in growth(results):
        print(line)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
