"""An OpenAI-compatible server as task generate's engine (`generate.engine: server`): vLLM's,
SGLang's, TGI's or llama.cpp's server, or a hosted API, already running; the shard jobs send it
their rows and hold no device (`Engine.devices` 0), inside the same plan, shards, atomic shard
files and proof.

What stays the task's, as on the other engines (`shardinfer.tasks.generate.task`): the prompts, token
for token (texts and conversations, chat template, system prompt, truncation to max_length) made
with model.path's tokenizer, each row's parameters and seed, decoding, the output columns and how
a structured row is judged. What the server gets, per row, is one /v1/completions request with
the prompt as those token ids (or their text, `generate.server.prompt: text`) and every parameter
that decides the row (`replies`), so a vLLM server's greedy and seeded rows equal the in-process
vLLM engine's.

- **Known before any job** (`endpoint`, `checks`): the server answers, serves the model (one it
  lists, or the one named), with room for max_length + max_new_tokens, and takes a one-token
  completion with the prompt as rows send it; what it says of itself (its `/v1/models` entry,
  `/version`, the completion's `system_fingerprint`: vLLM's build and a hash of its settings)
  enters the shard digest. A vLLM server (its models say `owned_by: vllm`) is spoken to in vLLM's
  dialect (token ids back, log-probabilities by token id, structured output); any other in the
  OpenAI API's fields only, and log-probabilities and structured output are refused for it.
- **The key** (`generate.server.api_key_env`) is read from its environment variable when a
  request is made, and never written to a log, the summary or the digest.
- **Requests** (`requests`): at most `concurrency` in flight per shard job, each with a timeout,
  retried with back-off on no answer, 408, 409, 429 and 5xx; the loop (`feeder`) keeps them
  flowing across windows and hands windows back whole and in order. A row the server refuses
  (400, 413, 422) is its row's error (`row_errors: record`); a server that stops answering fails
  the shard in one line, and its rerun resumes after the committed windows.

Its modules: `generate` (the engine, `ServerGenerate`), `endpoint` (the settings, the server's
identity), `checks` (what is refused before any job), `requests` (the HTTP client: httpx, in an
asyncio loop of its own), `feeder` (the loop between windows and requests) and `replies` (a row's
request, its reply as completions). httpx is imported inside functions only.
"""
