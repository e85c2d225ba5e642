"""A request per row, and its reply as the row's completions (`Completion`, as the other engines give
them), checked: the prompt ids the server ran (where it says them), the n completions asked, each
ended by eos, length or stop. Any other answer fails the shard in one line naming the row.

**The request** says every parameter that decides the row, so that the server's own defaults (a
model's generation_config, which vLLM's server applies by default) do not: greedy is temperature
0; sampling is the row's temperature, top_p and seed (`row_seed`, as the in-process engine seeds
it; vLLM seeds sample j with seed + j); top_k and min_p off. In vLLM's dialect also the eos ids as
`stop_token_ids`, special tokens skipped, the model's repetition penalty and min_tokens as the
in-process engine maps them, the generated token ids returned (`return_token_ids`), log-probabilities
by token id (`return_tokens_as_token_ids`) and structured output (`structured_outputs`, with the
whitespace `generate.structured` asks). In the OpenAI dialect only the OpenAI API's fields; its
replies carry text only, so a completion's tokens are its text encoded again, and `stop` cannot
be told from eos (a row with stop strings that stopped is `stop`).
"""

from __future__ import annotations

import numpy as np

from shardinfer.core.errors import UserError
from shardinfer.tasks.generate.columns import FINISH, Completion, finish_code
from shardinfer.tasks.generate.logprobs import SampleLogprobs
from shardinfer.tasks.generate.params import RowParams, row_seed

TOKEN_ID = "token_id:"  # vLLM's spelling of a token in log-probabilities (return_tokens_as_token_ids)
FLOOR = -9999.0  # where vLLM's server clamps -inf (a token the grammar masks)


def request_body(model: str, prompt, params: RowParams, index: int, dialect: str, eos_ids: list[int],
                 defaults: dict) -> dict:
    """A row's /v1/completions body; `defaults`: the model's generation_config as vLLM takes it."""
    body = {"model": model, "prompt": prompt, "max_tokens": params.max_new_tokens, "n": params.n}
    if params.do_sample:
        body.update(temperature=params.temperature, top_p=params.top_p, seed=row_seed(params.seed, index))
    else:
        body.update(temperature=0.0)
    if params.stop:
        body["stop"] = list(params.stop)
    if params.presence_penalty:
        body["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        body["frequency_penalty"] = params.frequency_penalty
    if params.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
    if dialect != "vllm":
        return body
    body.update(top_k=0, min_p=0.0, stop_token_ids=list(eos_ids), skip_special_tokens=True, return_token_ids=True,
                add_special_tokens=False, repetition_penalty=defaults.get("repetition_penalty", 1.0),
                min_tokens=defaults.get("min_tokens", 0))
    if params.logprobs is not None:
        body.update(logprobs=params.logprobs, return_tokens_as_token_ids=True)
    if params.structured:
        body["structured_outputs"] = structured_outputs(params.structured)
    return body


def structured_outputs(spec: dict) -> dict:
    """`generate.structured` in vLLM's request words (its whitespace as the in-process engine sets it)."""
    kind = next(kind for kind in ("json", "regex", "choice") if kind in spec)
    return {kind: spec[kind], "disable_any_whitespace": spec.get("whitespace") == "compact"}


class Replies:
    """Replies as completions, for one engine: its dialect, eos ids and tokenizer (to encode the
    text of an OpenAI-dialect reply)."""

    def __init__(self, dialect: str, eos_ids: list[int], tokenizer) -> None:
        self.dialect, self.eos_ids, self.tokenizer = dialect, eos_ids, tokenizer

    def refused(self, reply: dict) -> str | None:
        """Why the server failed the row inside an answer (a completion ended with `error` or `abort`)."""
        reasons = {choice.get("finish_reason") for choice in reply.get("choices") or []}
        bad = reasons & {"error", "abort"}
        return f"the server ended it with finish_reason {sorted(bad)[0]!r}" if bad else None

    def completions(self, reply: dict, sent: list[int] | None, params: RowParams, row: int) -> list[Completion]:
        """The row's n completions in order, checked (`sent`: the prompt ids it was sent, or None)."""
        choices = reply.get("choices") or []
        numbers = sorted(choice.get("index", -1) for choice in choices)
        if numbers != list(range(params.n)):
            raise UserError(f"row {row}: the server returned completions {numbers}, not 0..{params.n - 1}")
        if sent is not None and any(c.get("prompt_token_ids") not in (None, sent) for c in choices):
            raise UserError(f"row {row}: the server ran other prompt token ids than were sent")
        return [self.completion(choice, params, row) for choice in sorted(choices, key=lambda c: c["index"])]

    def completion(self, choice: dict, params: RowParams, row: int) -> Completion:
        reason = choice.get("finish_reason")
        if self.dialect != "vllm":
            return self.from_text(choice.get("text") or "", reason, params, row)
        if choice.get("token_ids") is None:
            raise UserError(f"row {row}: the vLLM server returned no token_ids for it")
        tokens = np.asarray(choice["token_ids"], dtype=np.int64)
        finish = finish_code(reason, choice.get("stop_reason"), self.eos_ids, params.stop, row, "the server")
        logprobs = None
        if params.logprobs is not None:
            logprobs = sample_logprobs(choice.get("logprobs"), tokens, params.logprobs, row)
        return Completion(tokens, finish, logprobs)

    def from_text(self, text: str, reason: str | None, params: RowParams, row: int) -> Completion:
        """An OpenAI-dialect completion: its text encoded again, eos appended where it stopped without
        a stop string (what the other engines count)."""
        if reason not in ("stop", "length"):
            raise UserError(f"row {row}: the server ended it with finish_reason {reason!r}; only stop and length "
                            "are results")
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        finish = FINISH.index("length") if reason == "length" else FINISH.index("stop" if params.stop else "eos")
        if finish == FINISH.index("eos") and self.eos_ids:
            ids = [*ids, self.eos_ids[0]]
        return Completion(np.asarray(ids, dtype=np.int64), finish)


def sample_logprobs(given: dict | None, tokens: np.ndarray, k: int, row: int) -> SampleLogprobs:
    """vLLM's completion log-probabilities (`return_tokens_as_token_ids`: keys `token_id:N`) as the
    chosen token's and the top k's, most likely first. Per position vLLM lists the chosen token, then
    the top k by rank (k + 1 keys); when the chosen is among those k, it is listed once, first (k
    keys), and goes where its value ranks it (before a token of equal value)."""
    steps = len(tokens)
    if not given or len(given.get("top_logprobs") or []) != steps or len(given.get("token_logprobs") or []) != steps:
        raise UserError(f"row {row}: the server returned log-probabilities for other than its {steps} tokens")
    chosen = np.empty(steps, dtype=np.float32)
    top_ids, top_values = np.zeros((steps, k), dtype=np.int32), np.zeros((steps, k), dtype=np.float32)
    for step, (token, value, top) in enumerate(zip(tokens, given["token_logprobs"], given["top_logprobs"])):
        entries = [(token_id(key, row), logprob) for key, logprob in (top or {}).items()]
        if not entries or entries[0][0] != token or len(entries) < k:
            raise UserError(f"row {row}: the server returned log-probabilities of other tokens than it generated")
        chosen[step] = unclamp(value)
        ranked = entries[1:k + 1] if len(entries) > k else sorted(entries, key=lambda entry: -entry[1])
        top_ids[step] = [entry[0] for entry in ranked]
        top_values[step] = [unclamp(entry[1]) for entry in ranked]
    return SampleLogprobs(chosen, top_ids, top_values)


def token_id(key: str, row: int) -> int:
    if not key.startswith(TOKEN_ID) or not key[len(TOKEN_ID):].isdigit():
        raise UserError(f"row {row}: the server named a token {key[:40]!r}, not by id (return_tokens_as_token_ids)")
    return int(key[len(TOKEN_ID):])


def unclamp(value: float | None) -> float:
    """-inf where the server wrote its floor for it (JSON has no -inf)."""
    return float("-inf") if value is None or value <= FLOOR else float(value)
