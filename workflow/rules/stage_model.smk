if MODEL_FILES:

    # Without a shared filesystem: the model's files (and the adapter's) copied into storage once,
    # on this machine, where model.path is; each shard job downloads them (shardinfer.snakefile.stored_model).
    rule stage_model:
        input:
            local(MODEL_FILES.sources(SETTINGS)),
        output:
            MODEL_COPIES["model"] + MODEL_COPIES.get("adapter", []),
        log:
            "logs/stage_model.log",
        localrule: True
        conda:
            "../../envs/inference.yaml"
        script:
            "../scripts/stage_model.py"
