"""`evaluate:`: the proven table scored against the gold values the input kept. Imports the tasks and
the rooms below them; never torch."""
