"""Snakemake adapter of the gather rule: see shardinfer.proof.gather.run_gather."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
snakemake = globals()["snakemake"]  # the job object injected by the script: directive

from shardinfer.config import EvaluateSettings, job_settings  # noqa: E402
from shardinfer.proof.gather import run_gather  # noqa: E402
from shardinfer.jobs import run_job  # noqa: E402

settings = job_settings(snakemake.params.settings, snakemake.config)
run_job(
    snakemake.log[0],
    run_gather,
    plan_path=snakemake.input.plan,
    shard_paths=list(snakemake.input.shards),
    inp=settings.input,
    model=snakemake.params.settings["model"],
    digest=snakemake.params.digest,
    predictions=snakemake.output.predictions,
    summary=snakemake.output.summary,
    files_folders=list(snakemake.input.files),
    evaluate=EvaluateSettings(**snakemake.params.evaluate),
    # Without a shared filesystem, the job's copies of the input's parts (proven by content).
    local_parts=snakemake.input.get("parts") and list(snakemake.input.parts),
    part_names=list(snakemake.params.part_names),
)
