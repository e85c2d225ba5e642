"""Snakemake adapter of the plan rule: see shardinfer.plan.run_plan."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
snakemake = globals()["snakemake"]  # the job object injected by the script: directive

from shardinfer.config import InputSettings  # noqa: E402
from shardinfer.jobs import run_job  # noqa: E402
from shardinfer.plan import run_plan  # noqa: E402

params = snakemake.params
run_job(snakemake.log[0], run_plan, InputSettings.from_dict(params.input), params.shards, params.max_length,
        snakemake.output.plan, params.shard_dir, params.files_dir, snakemake.output.staged, params.overhead,
        outdated=params.outdated)
