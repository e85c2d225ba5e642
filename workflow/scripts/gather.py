"""Snakemake adapter of the gather rule: see shardinfer.proof.gather.run_gather."""

from pathlib import Path

from shardinfer.core.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.proof.gather import run_gather  # noqa: E402
from shardinfer.settings.config import EvaluateSettings, job_settings  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

settings = job_settings(snakemake.params.settings, snakemake.config)
output = snakemake.output
# The parts layout's output is the folder's manifest: the folder is the table.
table = output.predictions if "predictions" in output.keys() else str(Path(output.manifest).parent)
# Without a shared filesystem in the parts layout: the parts' names in the bucket and their records.
stored = snakemake.params.get("stored_parts")
run_job(
    snakemake.log[0],
    run_gather,
    plan_path=snakemake.input.plan,
    shard_paths=list(stored if stored is not None else snakemake.input.shards),
    inp=settings.input,
    model=snakemake.params.settings["model"],
    digest=snakemake.params.digest,
    predictions=table,
    summary=output.summary,
    files_folders=list(snakemake.input.get("files", [])),
    evaluate=EvaluateSettings(**snakemake.params.evaluate),
    # Without a shared filesystem, the job's copies of the input's parts (proven by content).
    local_parts=snakemake.input.get("parts") and list(snakemake.input.parts),
    part_names=list(snakemake.params.part_names),
    output=settings.output,
    records=snakemake.input.get("records") and list(snakemake.input.records),
    copies=snakemake.input.get("copies") and list(snakemake.input.copies),
    batch_output=snakemake.output.get("batch_output"),
)
