"""Snakemake adapter of the infer rule: see shardinfer.shard.job.run_shard."""

from shardinfer.core.jobs import quiet_interrupt, run_job

if __name__ == "__main__":  # not in a process spawned from this job (below)
    # First: Ctrl-C during the imports below (pyarrow, torch: seconds) is one line, not a traceback.
    quiet_interrupt(globals()["snakemake"].rule)

from shardinfer.settings.config import job_settings  # noqa: E402
from shardinfer.shard.job import run_shard  # noqa: E402
from shardinfer.shard.runtime import ShardJob  # noqa: E402
from shardinfer.snakefile.stored_model import with_staged  # noqa: E402

# Everything under the guard: a process spawned from this job (a multi-GPU vLLM engine's workers)
# runs this file again as __mp_main__, without the job object Snakemake injected, and must not run
# the shard again.
if __name__ == "__main__":
    snakemake = globals()["snakemake"]  # the job object injected by the script: directive
    # Without a shared filesystem, the model is where its copies were downloaded.
    settings = job_settings(snakemake.params.settings, snakemake.config)
    settings = with_staged(settings, snakemake.input.get("model"), snakemake.input.get("adapter"))
    job = ShardJob(
        settings=settings,
        plan_path=snakemake.input.plan,
        shard=int(snakemake.wildcards.shard),
        output=snakemake.output.shard,
        digest=snakemake.params.digest,
        threads=snakemake.threads,
        tokens=snakemake.input.get("tokens"),
        tokenizer_key=snakemake.params.tokenizer_key,
        files=snakemake.output.get("files"),
        cut=snakemake.input.get("cut"),
        # output.layout parts: pieces of about output.part_size, but one part per shard in a bucket.
        part_bytes=settings.output.part_bytes
        if settings.output.parts and not snakemake.params.get("one_part")
        else None,
        record=snakemake.output.get("record"),
    )
    outdated = [*snakemake.params.outdated, *snakemake.params.also_outdated]
    run_job(snakemake.log[0], run_shard, job, outdated=outdated)
