rule plan:
    input:
        table=INPUT_FILES,
    output:
        plan="results/plan.json",
    log:
        "logs/plan.log",
    benchmark:
        "logs/plan.benchmark.tsv"
    conda:
        "../../envs/inference.yaml"
    params:
        input=SETTINGS.to_dict()["input"],
        shards=SETTINGS.shards,
        max_length=SETTINGS.model.max_length,
        shard_dir=os.path.dirname(SHARD_FILE),
        # Only a rerun trigger: a replaced input with an older mtime replans too.
        input_version=INPUT_VERSION,
    script:
        "../../scripts/plan.py"
