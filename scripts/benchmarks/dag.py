"""The DAG check of `benchmarks.load_check`: `snakemake -n` of the workflow with many shards against
a bare Snakefile with the same rules and directives but trivial values, in turns; their ratio is the
workflow's own Snakemake overhead per shard job.
"""

from __future__ import annotations

from pathlib import Path

import tiny_workflow as tiny
from benchmarks.timing import process_seconds

# The workflow's rules with the same directives and shapes (named inputs and outputs, log, benchmark,
# conda, threads, resources, params, script, a report item), each trivial: what Snakemake itself
# costs per job, against which the workflow's own overhead is measured.
BARE_SNAKEFILE = """\
SHARDS = int(config["shards"])
INPUT = config["input"]


wildcard_constraints:
    shard=r"\\d+",


rule all:
    input:
        "results/predictions.parquet",
        "results/report/run.html",


rule plan:
    input:
        table=INPUT,
    output:
        plan="results/plan.json",
        staged=directory("results/staged"),
    log:
        "logs/plan.log",
    benchmark:
        "logs/plan.benchmark.tsv"
    conda:
        "env.yaml"
    params:
        shards=SHARDS,
    script:
        "job.py"


rule infer:
    input:
        plan="results/plan.json",
        staged="results/staged",
    output:
        shard="results/shards/{shard}.parquet",
    log:
        "logs/infer/{shard}.log",
    benchmark:
        "logs/infer/{shard}.benchmark.tsv"
    conda:
        "env.yaml"
    threads: 4
    resources:
        gpu=1,
    params:
        settings={"batch": {"max_rows": 16}},
        digest="0123456789abcdef",
    script:
        "job.py"


rule gather:
    input:
        plan="results/plan.json",
        staged="results/staged",
        shards=expand("results/shards/{shard}.parquet", shard=range(SHARDS)),
    output:
        predictions="results/predictions.parquet",
        summary="results/summary.json",
    log:
        "logs/gather.log",
    benchmark:
        "logs/gather.benchmark.tsv"
    conda:
        "env.yaml"
    params:
        digest="0123456789abcdef",
    script:
        "job.py"


rule report_items:
    input:
        summary="results/summary.json",
    output:
        run=report("results/report/run.html", category="Run"),
    log:
        "logs/report.log",
    benchmark:
        "logs/report.benchmark.tsv"
    localrule: True
    conda:
        "env.yaml"
    script:
        "job.py"
"""


def check_dag(workdir: Path, model: Path, shards: int, repeats: int = 2) -> None:
    """`snakemake -n` of the workflow and of BARE_SNAKEFILE with `shards` shards over the same input,
    run in turns `repeats` times each (best kept: the machine may be shared); prints both and their ratio."""
    path = tiny.write_input(tiny.input_frame(shards, seed=2), workdir / "data" / "input.parquet")
    ours, env = tiny.prepare_workdir(workdir / "ours", tiny.workflow_config(path, model, shards=shards), "-n", "-q")
    bare = workdir / "bare"
    bare.mkdir(parents=True, exist_ok=True)
    (bare / "Snakefile").write_text(BARE_SNAKEFILE)
    (bare / "job.py").write_text("from pathlib import Path\n\nfor path in snakemake.output:\n    Path(path).touch()\n")
    (bare / "env.yaml").write_text("channels: [conda-forge]\ndependencies: [python]\n")
    bare_command = [*ours[:ours.index("-s") + 1], str(bare / "Snakefile"), *ours[ours.index("-s") + 2:],
                    "--config", f"shards={shards}", f"input={path}"]
    runs = {"workflow": [], "bare": []}
    for _ in range(repeats):
        runs["workflow"].append(process_seconds(ours, workdir / "ours", env))
        runs["bare"].append(process_seconds(bare_command, bare, env))
    (wall, cpu), (bare_wall, bare_cpu) = (min(runs["workflow"]), min(runs["bare"]))
    print(f"snakemake -n with {shards} shards (best of {repeats}): workflow {wall:.1f} s wall, {cpu:.1f} s CPU; "
          f"bare Snakefile {bare_wall:.1f} s wall, {bare_cpu:.1f} s CPU; ratio {wall / bare_wall:.2f}x wall, "
          f"{cpu / bare_cpu:.2f}x CPU", flush=True)
