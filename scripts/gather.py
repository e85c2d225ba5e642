"""Snakemake adapter of the gather rule: see shardinfer.proof.gather.run_gather."""

from shardinfer.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.config import EvaluateSettings, job_settings  # noqa: E402
from shardinfer.proof.gather import run_gather  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

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
