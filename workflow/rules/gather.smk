rule gather:
    input:
        plan=rules.plan.output.plan,
        shards=shard_files(),
    output:
        predictions="results/predictions.parquet",
        summary="results/summary.json",
    log:
        "logs/gather.log",
    benchmark:
        "logs/gather.benchmark.tsv"
    conda:
        "../../envs/inference.yaml"
    params:
        settings=SETTINGS.to_dict(),
        digest=DIGEST,
    script:
        "../../scripts/gather.py"
