rule plan:
    input:
        table=LAYOUT.input_value("files"),
    output:
        # Copies of the parts that shards cannot read by range (input.stage; often empty), or without a
        # shared filesystem each shard's rows (shardinfer.snakefile.layout).
        **outputs(LAYOUT.plan_outputs),
        plan=LAYOUT.path("results/plan.json"),
    log:
        LAYOUT.path("logs/plan.log"),
    benchmark:
        LAYOUT.path("logs/plan.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    params:
        # With input.image_column, the tokens an image adds to its row's cost (image_cost).
        **PLAN_IMAGE_PARAMS,
        input=LAYOUT.input_value("plan_input"),
        shards=LAYOUT.input_value("shards"),
        max_length=SETTINGS.model.max_length,
        # What a row adds to its cost in a batch (generate: max_new_tokens), balanced too.
        overhead=PLAN_OVERHEAD,
        shard_dir=LAYOUT.shard_dir,
        files_dir=LAYOUT.files_root,
        # Only a rerun trigger: a replaced input with an older mtime replans too.
        input_version=LAYOUT.input_value("version"),
        outdated=LAYOUT.outdated,
        # The other files of output.writers: a param Snakemake does not compare (Layout.also_outdated).
        also_outdated=LAYOUT.also_outdated,
    script:
        "../scripts/plan.py"
