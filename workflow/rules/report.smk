rule report_items:
    input:
        summary=rules.gather.output.summary,
    output:
        # With `evaluate:`, the scores' table and the confusion matrix (common.smk); none otherwise.
        **METRICS_ITEMS,
        # For a task whose rows are texts in tokens, the text-length figure (common.smk); none otherwise.
        **TOKEN_ITEMS,
        run=report(
            named_path("results/report/run.html"),
            caption="../report/run.rst",
            category="Run",
            subcategory="Overview",
            labels=report_labels({"item": "the run at a glance"}),
        ),
        shards=report(
            named_path("results/report/shards.html"),
            caption="../report/shards.rst",
            category="Run",
            subcategory="Overview",
            labels=report_labels({"item": "per shard"}),
        ),
        rows_per_s=report(
            named_path("results/report/rows_per_s.png"),
            caption="../report/rows_per_s.rst",
            category="Run",
            subcategory="Throughput",
            labels=report_labels({"item": "rows/s per shard"}),
        ),
        stages=report(
            named_path("results/report/stages.png"),
            caption="../report/stages.rst",
            category="Run",
            subcategory="Throughput",
            labels=report_labels({"item": "time per pipeline stage"}),
        ),
    log:
        named_path("logs/report.log"),
    benchmark:
        named_path("logs/report.benchmark.tsv")
    # Runs where Snakemake runs, never submitted to a cluster: it reads one JSON file and draws
    # a few small figures, in about a second.
    localrule: True
    conda:
        "../../envs/inference.yaml"
    script:
        "../../scripts/report.py"
