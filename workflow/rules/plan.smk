rule plan:
    input:
        table=input_value("files"),
    output:
        # Copies of the parts that shards cannot read by range (input.stage; often empty), or without a
        # shared filesystem each shard's rows (common.smk).
        **PLAN_READS,
        plan=named_path("results/plan.json"),
    log:
        named_path("logs/plan.log"),
    benchmark:
        named_path("logs/plan.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    params:
        input=input_value("plan_input"),
        shards=input_value("shards"),
        max_length=SETTINGS.model.max_length,
        # What a row adds to its cost in a batch (generate: max_new_tokens), balanced too.
        overhead=PLAN_OVERHEAD,
        shard_dir=os.path.dirname(SHARD_FILE),
        files_dir=os.path.dirname(FILES_DIR),
        # Only a rerun trigger: a replaced input with an older mtime replans too.
        input_version=input_value("version"),
        outdated=outdated_outputs,
    script:
        "../../scripts/plan.py"
