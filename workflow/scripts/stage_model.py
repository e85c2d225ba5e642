"""Snakemake adapter of the stage_model rule: see shardinfer.snakefile.stored_model.stage."""

from shardinfer.core.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.snakefile.stored_model import stage  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

run_job(snakemake.log[0], stage, list(snakemake.input), list(snakemake.output))
