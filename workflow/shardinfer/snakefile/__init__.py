"""What the Snakefile calls when it loads: the settings of a validated config, the checks before any
job runs, what decides a shard's digest, the rules' params and every path they name, the model's
copies in storage, the shard count of `shards: auto`, and an interrupted run's marks settled. Imports
every room below it; never torch."""
