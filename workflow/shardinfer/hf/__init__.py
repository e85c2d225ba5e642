"""What tasks need of Hugging Face and of batching: token ids made here or ahead, models loaded from
local folders only, tokenizer files, labels, and length-sorted batches under a token budget.
Imports the plan and the rooms below it; torch and transformers only inside functions."""
