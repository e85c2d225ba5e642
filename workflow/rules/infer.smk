rule infer:
    input:
        **LAYOUT.tokens_input,
        # The copies the shards read of parts they cannot read by range (often none): a folder
        # deleted by hand replans instead of failing the shards. Without a shared filesystem: the
        # shard's own rows, cut by the plan (shardinfer.snakefile.layout).
        **LAYOUT.shard_reads,
        # Without a shared filesystem: the model's copies in storage (common.smk).
        **model_copies(model="model", adapter="adapter"),
        # Not the input's files: the plan stands for them (a changed input replans, and a newer
        # plan reruns the shards), and listing every part in every shard job costs parts x shards.
        plan=rules.plan.output.plan,
    output:
        # The shard file and files folder (without a shared filesystem in the parts layout: the part
        # in the bucket and the job's record of it; shardinfer.snakefile.layout).
        **outputs(LAYOUT.shard_outputs),
    log:
        LAYOUT.path("logs/infer/{shard}.log"),
    benchmark:
        LAYOUT.path("logs/infer/{shard}.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    threads: INFER_THREADS
    resources:
        # The devices one engine spans (1, or generate.vllm's tensor x pipeline parallel sizes),
        # leased together by the job; the Slurm plugin asks `sbatch --gpus=` for them. An engine
        # over N machines (generate.vllm.nnodes): `nodes=N, gres="gpu:K"` instead, K GPUs on each
        # (`sbatch --nodes=N --gres=gpu:K`; shardinfer.nodes.span).
        **ENGINE_NODES.resources(),
    params:
        # Without a shared filesystem in the parts layout: one part per shard (shardinfer.snakefile.layout).
        **LAYOUT.infer_params,
        # Only a rerun trigger, with input.image_column: an image file its rows name replaced,
        # edited or removed reruns this shard alone (shardinfer.input.image_files).
        **LAYOUT.image_params,
        settings=LAYOUT.input_value("job_settings"),
        digest=LAYOUT.input_value("digest"),
        tokenizer_key=LAYOUT.tokenizer_key,
        outdated=LAYOUT.outdated,
        # The other files of output.writers: a param Snakemake does not compare (Layout.also_outdated).
        also_outdated=LAYOUT.also_outdated,
    script:
        "../scripts/infer.py"
