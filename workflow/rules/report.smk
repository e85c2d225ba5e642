rule report_items:
    input:
        summary=rules.gather.output.summary,
    output:
        run=report(
            "results/report/run.html",
            caption="../report/run.rst",
            category="Run",
            subcategory="Overview",
            labels={"item": "the run at a glance"},
        ),
        shards=report(
            "results/report/shards.html",
            caption="../report/shards.rst",
            category="Run",
            subcategory="Overview",
            labels={"item": "per shard"},
        ),
        rows_per_s=report(
            "results/report/rows_per_s.png",
            caption="../report/rows_per_s.rst",
            category="Run",
            subcategory="Throughput",
            labels={"item": "rows/s per shard"},
        ),
        stages=report(
            "results/report/stages.png",
            caption="../report/stages.rst",
            category="Run",
            subcategory="Throughput",
            labels={"item": "time per pipeline stage"},
        ),
        token_lengths=report(
            "results/report/token_lengths.png",
            caption="../report/token_lengths.rst",
            category="Input",
            subcategory="Text lengths",
            labels={"item": "text lengths in tokens"},
        ),
    log:
        "logs/report.log",
    benchmark:
        "logs/report.benchmark.tsv"
    # Runs where Snakemake runs, never submitted to a cluster: it reads one JSON file and draws
    # three small figures, in about a second.
    localrule: True
    conda:
        "../../envs/inference.yaml"
    script:
        "../../scripts/report.py"
