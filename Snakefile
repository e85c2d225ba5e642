# Sharded batch inference with Hugging Face models: plan -> one GPU job per shard -> gather
# that proves every input row is in the output once, in order.
#
#   snakemake --cores all --resources gpu=4     # a workstation with 4 GPUs
#   snakemake --cores all                       # no GPU: the same workflow on CPU
#   snakemake --report report.zip               # afterwards: the run's tables and figures


from snakemake.utils import min_version

min_version("9.0")


# Skipped when this workflow is a module given `config:` (README: "Use as a module").
configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/tokenize.smk"
include: "workflow/rules/infer.smk"
include: "workflow/rules/gather.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.gather.output,
        rules.report_items.output,


onsuccess:
    print_run_summary(rules.gather.output.predictions, rules.gather.output.summary)
