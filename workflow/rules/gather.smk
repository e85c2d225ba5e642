rule gather:
    input:
        # Their digests are checked: the staged copies, or without a shared filesystem the input's parts.
        **GATHER_READS,
        plan=rules.plan.output.plan,
        # Input functions, not lists: beside a `rules.plan` input, Snakemake hashes a named list
        # once per item (shards x shards: 12 s of the dry run at 10,000 shards).
        shards=shard_files,
        files=files_folders,
    output:
        **GATHERED,
    log:
        named_path("logs/gather.log"),
    benchmark:
        named_path("logs/gather.benchmark.tsv")
    conda:
        "../../envs/inference.yaml"
    params:
        settings=input_value("job_settings"),
        digest=input_value("digest"),
        # gather's alone, not the shards': changing `evaluate:` reruns gather and the report only.
        evaluate=input_value("evaluate"),
        # Only a rerun trigger: a copied or rewritten input is checked again by its content digest.
        input_identity=input_value("identity"),
        # Without a shared filesystem, the parts' names as this job's listing of the bucket found
        # them (input `parts` are their local copies), which must be the planned ones.
        part_names=GATHER_PART_NAMES,
    script:
        "../../scripts/gather.py"
