"""Snakemake adapter of the tokenize rule: see shardinfer.shard.tokenize_job.run_tokenize (not named tokenize.py,
which would shadow the standard library module of that name for scripts run from this folder).

The settings come from the (validated) config rather than a param, so that changing the model
but not its tokenizer leaves this rule's params, and so its token files, as they are.
"""

from shardinfer.core.jobs import quiet_interrupt, run_job

# First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.plan.plan_file import read_plan  # noqa: E402
from shardinfer.shard.tokenize_job import TokenizeJob, run_tokenize  # noqa: E402
from shardinfer.snakefile.configure import settings_from_config  # noqa: E402
from shardinfer.snakefile.stored_model import handed, with_handed_paths, with_staged  # noqa: E402

snakemake = globals()["snakemake"]  # the job object injected by the script: directive

# `shards: auto` stands for the count the plan was cut into. Without a shared filesystem (a cut to
# read) the input's parts are the plan's, which it found in the bucket, and model.path the main
# process's (a `pkg:` model this node may lack).
plan = read_plan(snakemake.input.plan)
cut = snakemake.input.get("cut")
listed = {plan.input_path: [part.path for part in plan.parts]} if cut else None
config = with_handed_paths(snakemake.config, handed()) if cut else snakemake.config
settings = settings_from_config(config, snakemake.wildcards.get("name"), plan.shards, listed)
job = TokenizeJob(
    # Without a shared filesystem, the tokenizer is where its copies were downloaded.
    settings=with_staged(settings, snakemake.input.get("model")),
    plan_path=snakemake.input.plan,
    shard=int(snakemake.wildcards.shard),
    output=snakemake.output.tokens,
    tokenizer_key=snakemake.params.tokenizer_key,
    threads=snakemake.threads,
    cut=cut,
)
run_job(snakemake.log[0], run_tokenize, job)
