"""What a user reads: the lines on the terminal after a run and the items of `snakemake --report`,
both made from results/summary.json. The top room."""
