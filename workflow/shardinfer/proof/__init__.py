"""What gather proves and publishes: the input and every shard against the plan, the values each
shard's job wrote, the folder of parts and its manifest, a folder verified on its own, and
summary.json's figures. Imports the rooms below it; never torch."""
