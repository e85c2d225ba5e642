# Sharded batch inference with Hugging Face models: plan -> one GPU job per shard -> gather
# that proves every input row is in the output once, in order.
#
#   snakemake --cores all --resources gpu=4     # a workstation with 4 GPUs
#   snakemake --cores all                       # no GPU: the same workflow on CPU


from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/tokenize.smk"
include: "workflow/rules/infer.smk"
include: "workflow/rules/gather.smk"


rule all:
    default_target: True
    input:
        rules.gather.output,
