rule infer:
    input:
        plan=rules.plan.output.plan,
        table=SETTINGS.input.path,
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
    script:
        "../../scripts/infer.py"
