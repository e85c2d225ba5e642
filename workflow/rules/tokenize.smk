rule tokenize:
    input:
        **SHARD_READS,  # as in rule infer
        **TOKENIZE_MODEL,  # without a shared filesystem: the tokenizer's copies in storage
        plan=rules.plan.output.plan,  # stands for the input's files, as in rule infer
    output:
        tokens=TOKENS_FILE,
    log:
        named_path("logs/tokenize/{shard}.log"),
    benchmark:
        named_path("logs/tokenize/{shard}.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    threads: INFER_THREADS
    params:
        # The only tracked param: token files are reused while it holds, whatever the model.
        tokenizer_key=TOKENIZER_KEY,
    script:
        "../../scripts/tokenize_shard.py"
