"""Snakemake adapter of the gather rule: the job's GatherJob, built here, run by
shardinfer.proof.gather.run_gather."""

from shardinfer.core.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.proof.gather import GatherJob, run_gather  # noqa: E402
from shardinfer.settings.config import EvaluateSettings, job_settings  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive


def listed(paths):
    """A named input's paths as a tuple; None where the rule has no such input."""
    return None if not paths else tuple(paths)


settings = job_settings(snakemake.params.settings, snakemake.config)
# Without a shared filesystem in the parts layout: the parts' names in the bucket and their records.
stored = snakemake.params.get("stored_parts")
job = GatherJob(
    plan_path=snakemake.input.plan,
    shard_paths=tuple(stored if stored is not None else snakemake.input.shards),
    inp=settings.input,
    model=snakemake.params.settings["model"],
    digest=snakemake.params.digest,
    # The summary and each writer's files (shardinfer.output): the parts layout's Parquet output is
    # the folder's manifest, the folder being the table.
    outputs=dict(snakemake.output.items()),
    output=settings.output,
    evaluate=EvaluateSettings(**snakemake.params.evaluate),
    files_folders=tuple(snakemake.input.get("files", [])),
    # Without a shared filesystem, the job's copies of the input's parts (proven by content).
    local_parts=listed(snakemake.input.get("parts")),
    part_names=tuple(snakemake.params.part_names),
    records=listed(snakemake.input.get("records")),
    copies=listed(snakemake.input.get("copies")),
)
run_job(snakemake.log[0], run_gather, job)
