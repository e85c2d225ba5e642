rule gather:
    input:
        # Their digests are checked: the staged copies, or without a shared filesystem the input's parts.
        **LAYOUT.gather_reads,
        # The shard files and files folders (without a shared filesystem in the parts layout, the shards'
        # records instead of the parts: shardinfer.snakefile.layout). Input functions, not lists: beside a
        # `rules.plan` input, Snakemake hashes a named list once per item (shards x shards: 12 s of
        # the dry run at 10,000 shards).
        **LAYOUT.gather_shards,
        plan=rules.plan.output.plan,
    output:
        # Each chosen writer's files (output.writers: shardinfer.output; a writer's folder of parts
        # flagged as such) and the summary.
        **outputs(LAYOUT.gathered),
    log:
        LAYOUT.path("logs/gather.log"),
    benchmark:
        LAYOUT.path("logs/gather.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    params:
        # Without a shared filesystem in the parts layout, the parts' names in the bucket; where
        # output.writers is not an input's default, the writers (switching one off reruns gather).
        **LAYOUT.gather_params,
        # Only a rerun trigger, with input.image_column: an image file rewritten with its size and
        # mtime put back is checked again by its bytes (shardinfer.input.image_files).
        **LAYOUT.gather_image_params,
        settings=LAYOUT.input_value("job_settings"),
        digest=LAYOUT.input_value("digest"),
        # gather's alone, not the shards': changing `evaluate:` reruns gather and the report only.
        evaluate=LAYOUT.input_value("evaluate"),
        # Only a rerun trigger: a copied or rewritten input is checked again by its content digest.
        input_identity=LAYOUT.input_value("identity"),
        # Without a shared filesystem, the parts' names as this job's listing of the bucket found
        # them (input `parts` are their local copies), which must be the planned ones.
        part_names=LAYOUT.gather_part_names,
    script:
        "../scripts/gather.py"
