rule infer:
    input:
        **TOKENS_INPUT,
        # The copies the shards read of parts they cannot read by range (often none): a folder
        # deleted by hand replans instead of failing the shards. Without a shared filesystem: the
        # shard's own rows, cut by the plan (common.smk).
        **SHARD_READS,
        # Without a shared filesystem: the model's copies in storage (common.smk).
        **INFER_MODEL,
        # Not the input's files: the plan stands for them (a changed input replans, and a newer
        # plan reruns the shards), and listing every part in every shard job costs parts x shards.
        plan=rules.plan.output.plan,
    output:
        **SHARD_FILES_OUTPUT,
        shard=SHARD_FILE,
    log:
        named_path("logs/infer/{shard}.log"),
    benchmark:
        named_path("logs/infer/{shard}.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    threads: INFER_THREADS
    resources:
        gpu=1,
    params:
        settings=input_value("job_settings"),
        digest=input_value("digest"),
        tokenizer_key=TOKENIZER_KEY,
        outdated=outdated_outputs,
    script:
        "../../scripts/infer.py"
