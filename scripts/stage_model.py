"""Snakemake adapter of the stage_model rule: see shardinfer.stored_model.stage."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
snakemake = globals()["snakemake"]  # the job object injected by the script: directive

from shardinfer.jobs import run_job  # noqa: E402
from shardinfer.stored_model import stage  # noqa: E402

run_job(snakemake.log[0], stage, list(snakemake.input), list(snakemake.output))
