"""One shard job: its device (a GPU lease that knows no model), then read → prepare → batch → device →
write as background stages, committed window by window so a killed job resumes. Imports the tasks
and the rooms below them."""
