# The workflow is defined in workflow/Snakefile (where the Snakemake workflow catalog looks for it).
# This file is what to give `-s` from your own folder: `snakemake -s <clone>/Snakefile` also
# applies the workflow profile profiles/default beside it, which Snakemake looks for next to the
# Snakefile it is given (and in the working directory). Included as Snakemake includes a main
# Snakefile, so that its `rule all` stays the default target (an `include:` would drop it).

workflow.include("workflow/Snakefile", overwrite_default_target=True)
