"""Snakemake adapter of the plan rule: see shardinfer.plan.plan_file.run_plan."""

from shardinfer.core.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.plan.plan_file import run_plan  # noqa: E402
from shardinfer.settings.config import InputSettings  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

params, output = snakemake.params, snakemake.output
# Without a shared filesystem the parts are read where the job's storage copies lie, and each shard's
# rows are cut (output `cuts`) instead of staged (output `staged`).
cuts = output.get("cuts")
run_job(snakemake.log[0], run_plan, InputSettings.from_dict(params.input), params.shards, params.max_length,
        output.plan, params.shard_dir, params.files_dir, output.get("staged"), params.overhead,
        local_parts=list(snakemake.input.table) if cuts else None, cut_paths=cuts and list(cuts),
        image_cost=params.get("image_cost", 0), outdated=[*params.outdated, *params.also_outdated])
