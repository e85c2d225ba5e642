rule tokenize:
    input:
        **LAYOUT.shard_reads,  # as in rule infer
        **model_copies(model="tokenizer"),  # without a shared filesystem: the tokenizer's files alone
        plan=rules.plan.output.plan,  # stands for the input's files, as in rule infer
    output:
        tokens=LAYOUT.tokens_file,
    log:
        LAYOUT.path("logs/tokenize/{shard}.log"),
    benchmark:
        LAYOUT.path("logs/tokenize/{shard}.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    threads: INFER_THREADS
    params:
        # The only tracked param: token files are reused while it holds, whatever the model.
        tokenizer_key=LAYOUT.tokenizer_key,
    script:
        "../scripts/tokenize_shard.py"
