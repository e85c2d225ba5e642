"""Task generate on vLLM's offline engine (`generate.engine: vllm`): continuous batching, a paged
KV cache and prefix caching, inside the same plan, shards, atomic shard files and proof.

What stays the transformers engine's (`shardinfer.tasks.generate`): the prompts, token for token
(texts and conversations, chat template, system prompt, truncation to max_length), the eos ids
(the tokenizer's and the generation_config's), each row's parameters (`RowParams`), decoding
(special tokens skipped, cut before a stop string), the output columns and how a structured row
is judged. What the engine gets:

- **Images** (`input.image_column`, `shardinfer.tasks.generate_images`): a row's prompt ids with
  one image token per image and its decoded images as `multi_modal_data`, which vLLM expands
  itself; its output's prompt ids must equal the model processor's expansion, which the
  transformers engine runs.
- **Whole windows.** Each window of `batch.sort_window` rows is one `enqueue` of token-id prompts
  (`{"prompt_token_ids": ...}`), and the engine schedules them itself; `batch.max_tokens` and
  `max_rows` do not apply (`generate.vllm.max_num_seqs` and `max_num_batched_tokens` do). The
  pipeline reads, tokenizes and writes the windows around it in background threads.
- **Exactly once, checked.** Each row's request id comes back from `enqueue`; every output is
  matched to its row by that id, and a row missing, returned twice, with other prompt ids than
  were sent, or ended otherwise than eos, length or stop (`abort`, `error`, ...) fails the shard
  in one line naming the row. The shard file is written only when its last window holds.
- **One SamplingParams per row**, from its parameters: `seed=row_seed(generate.seed, global row
  index)`, so a row's samples depend on its prompt, the seed and its index, not on the rows beside
  it in the engine; `n` (vLLM seeds sample j with seed + j: sample 0 is the n = 1 sample);
  `logprobs`; `structured_outputs` (the spec checked by vLLM's own xgrammar check when the task
  loads, since one it refuses would fail every window's call). The engine is started with the
  xgrammar backend pinned and raw log-probabilities (`engine.output_arguments`).
- **In-process engine** (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): no engine-core process is spawned,
  and scheduling is deterministic (vLLM's reproducibility docs). An engine that spans several
  devices (`generate.vllm.tensor_parallel_size` x `pipeline_parallel_size`) drives one worker
  process per device from this process; the workers run the job's script again without its body
  (its `__main__` guard), so the shard runs once.

Its modules: `checks` (what is refused before any job runs, the devices an engine spans, and the
engine's identity in the shard digest), `engine` (the engine's arguments and start), `parallel`
(the devices it spans: its workers' GPUs or CPU cores), `task` (the task on the engine) and
`matching` (each output to its row, checked). They import vLLM inside their functions only: the
config checks read its settings without it.
"""
