rule plan:
    input:
        table=SETTINGS.input.path,
    output:
        plan="results/plan.json",
    log:
        "logs/plan.log",
    conda:
        "../../envs/inference.yaml"
    params:
        settings=SETTINGS.to_dict(),
    script:
        "../../scripts/plan.py"
