"""The plan: a row's estimated cost, the shards' ranges of balanced cost, and the plan file that gather
proves the shard files against. Imports the input and the rooms below it; never torch."""
