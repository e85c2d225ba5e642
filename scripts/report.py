"""Snakemake adapter of the report_items rule: see shardinfer.report.write_report."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
snakemake = globals()["snakemake"]  # the job object injected by the script: directive

from shardinfer.jobs import run_job  # noqa: E402
from shardinfer.report import ReportFiles, write_report  # noqa: E402

# The `evaluate:` items are outputs only when it is on, the text-length figure only for a task that
# counts tokens (shardinfer.layout.OPTIONAL_REPORTS): None otherwise.
files = ReportFiles(**{name: getattr(snakemake.output, name, None) for name in ReportFiles.__dataclass_fields__})
run_job(snakemake.log[0], write_report, snakemake.input.summary, files)
