"""Snakemake adapter of the report_items rule: see shardinfer.report.snakemake_report.write_report."""

from shardinfer.core.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.report.snakemake_report import ReportFiles, write_report  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

# The `evaluate:` items are outputs only when it is on, the text-length figure only for a task that
# counts tokens (shardinfer.snakefile.report_items.OPTIONAL_REPORTS): None otherwise.
files = ReportFiles(**{name: getattr(snakemake.output, name, None) for name in ReportFiles.__dataclass_fields__})
run_job(snakemake.log[0], write_report, snakemake.input.summary, files)
