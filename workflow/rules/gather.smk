rule gather:
    input:
        plan=rules.plan.output.plan,
        # Input functions, not lists: beside a `rules.plan` input, Snakemake hashes a named list
        # once per item (shards x shards: 12 s of the dry run at 10,000 shards).
        shards=shard_files,
        files=files_folders,
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
        settings=JOB_SETTINGS,
        digest=DIGEST,
        # Only a rerun trigger: a copied or rewritten input is checked again by its content digest.
        input_identity=INPUT_IDENTITY,
    script:
        "../../scripts/gather.py"
