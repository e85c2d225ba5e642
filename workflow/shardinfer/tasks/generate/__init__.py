"""Generation (`task: generate`): the task (`task`), what it refuses (`checks`), the prompts every
engine gets (`prompts`, `images`), each row's parameters (`params`, `sampling`), structured output,
log-probabilities and the output columns; the transformers engine's generation (`hf`). Imports the
rooms below the tasks; torch and transformers only inside functions."""
