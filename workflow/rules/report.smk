rule report_items:
    input:
        summary=rules.gather.output.summary,
    output:
        # With `evaluate:`, the scores' table and the confusion matrix; for a task whose rows are
        # texts in tokens, the text-length figure (shardinfer.snakefile.report_items.OPTIONAL_REPORTS).
        **optional_reports(),
        run=report(
            LAYOUT.path("results/report/run.html"),
            caption="../report/run.rst",
            category="Run",
            subcategory="Overview",
            labels=LAYOUT.report_labels("the run at a glance"),
        ),
        shards=report(
            LAYOUT.path("results/report/shards.html"),
            caption="../report/shards.rst",
            category="Run",
            subcategory="Overview",
            labels=LAYOUT.report_labels("per shard"),
        ),
        rows_per_s=report(
            LAYOUT.path("results/report/rows_per_s.png"),
            caption="../report/rows_per_s.rst",
            category="Run",
            subcategory="Throughput",
            labels=LAYOUT.report_labels("rows/s per shard"),
        ),
        stages=report(
            LAYOUT.path("results/report/stages.png"),
            caption="../report/stages.rst",
            category="Run",
            subcategory="Throughput",
            labels=LAYOUT.report_labels("time per pipeline stage"),
        ),
    log:
        LAYOUT.path("logs/report.log"),
    benchmark:
        LAYOUT.path("logs/report.benchmark.tsv")
    # Runs where Snakemake runs, never submitted to a cluster: it reads one JSON file and draws
    # a few small figures, in about a second.
    localrule: True
    conda:
        "../../envs/inference.yaml"
    script:
        "../scripts/report.py"
