"""vLLM's offline engine for task generate (`generate.engine: vllm`): continuous batching, a paged
KV cache and prefix caching, inside the same plan, shards, atomic shard files and proof. Its pooling
runner for the encoder tasks (`<task>.engine: vllm` for embed, classify, score, token-classify) is
`pooling`, fed by the same loop (`feeder`): that module says what it keeps of the transformers
engine.

What stays the task's, as on the transformers engine (`shardinfer.tasks.generate.task`): the
prompts, token for token (texts and conversations, chat template, system prompt, truncation to
max_length), the eos ids (the tokenizer's and the generation_config's), each row's parameters
(`RowParams`), decoding (special tokens skipped, cut before a stop string), the output columns
and how a structured row is judged. What the engine gets:

- **Images** (`input.image_column`, `shardinfer.tasks.generate.images`): a row's prompt ids with
  one image token per image and its decoded images as `multi_modal_data`, which vLLM expands
  itself; its output's prompt ids must equal the model processor's expansion, which the
  transformers engine runs.
- **One stream of requests, kept full.** Each row is one request of token ids
  (`{"prompt_token_ids": ...}`) added to the engine by one loop over the shard's windows
  (`feeder`): the next window's rows join while the current window's last rows finish, so the
  engine does not drain at a window's end, and windows still come out whole and in order, to be
  written and committed one by one (resume as before). `batch.max_tokens` and `max_rows` do not
  apply (`generate.vllm.max_num_seqs` and `max_num_batched_tokens` do). The pipeline reads,
  tokenizes and writes the windows around it in background threads.
- **A bad prompt costs its row.** The prompts are checked before the engine sees them (as for the
  transformers engine: `generate_prompts.prompt_problem`); a request the engine refuses as it is
  added, or ends with finish_reason `error`, fails its row alone; a failure inside the engine is
  narrowed to the rows that fail alone, and an engine that dies is started again once
  (`feeder`). With `row_errors: record` such rows are error rows, otherwise the shard fails in
  one line naming the row.
- **Exactly once, checked.** Every output is matched to its row by its request id, and a row
  missing, returned twice, with other prompt ids than were sent, or ended otherwise than eos,
  length or stop fails the shard in one line naming the row. The shard file is written only when
  its last window holds.
- **One SamplingParams per row**, from its parameters: `seed=row_seed(generate.seed, global row
  index)`, so a row's samples depend on its prompt, the seed and its index, not on the rows beside
  it in the engine; `n` (vLLM seeds sample j with seed + j: sample 0 is the n = 1 sample);
  `logprobs`; `structured_outputs` (the spec checked by vLLM's own xgrammar check when the engine
  loads, since one it refuses would fail every window's call). The engine is started with the
  xgrammar backend pinned and raw log-probabilities (`engine.output_arguments`).
- **In-process engine** (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): no engine-core process is spawned,
  and scheduling is deterministic (vLLM's reproducibility docs). An engine that spans several
  devices (`generate.vllm.tensor_parallel_size` x `pipeline_parallel_size`) drives one worker
  process per device from this process; the workers run the job's script again without its body
  (its `__main__` guard), so the shard runs once.

Its modules: `fed` (what both engines share: `FedVllm`, one LLM fed every window, restarted in
place), `generate` (the engine: `VllmGenerate`, serving task generate), `checks` (what is
refused before any job runs, the devices an engine spans, and the engine's identity in the shard
digest), `engine` (the engine's arguments and start), `parallel` (the devices it spans: its
workers' GPUs or CPU cores), `feeder` (the loop between the windows and the engine) and `matching`
(each output as the row's results, checked); `pooling` (the pooling runner: `VllmPooling`) and
`pooling_checks` (what the encoder tasks on it are refused). They import vLLM inside their functions only: the
config checks read its settings without it. What serves any engine of task generate lives with
the task (`shardinfer.tasks.generate.task`: the row seeds in `params`, the finish reasons in `columns`).
"""
