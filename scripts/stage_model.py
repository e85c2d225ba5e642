"""Snakemake adapter of the stage_model rule: see shardinfer.stored_model.stage."""

from shardinfer.jobs import run_job
from shardinfer.stored_model import stage

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

run_job(snakemake.log[0], stage, list(snakemake.input), list(snakemake.output))
