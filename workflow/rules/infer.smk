rule infer:
    input:
        plan=rules.plan.output.plan,
        table=SETTINGS.input.path,
        tokens=token_file,
    output:
        shard=SHARD_FILE,
    log:
        "logs/infer/{shard}.log",
    benchmark:
        "logs/infer/{shard}.benchmark.tsv"
    conda:
        "../../envs/inference.yaml"
    threads: 4
    resources:
        gpu=1,
    params:
        settings=SETTINGS.to_dict(),
        digest=DIGEST,
        tokenizer_key=TOKENIZER_KEY,
    script:
        "../../scripts/infer.py"
