"""Log-probabilities of the generated tokens (`generate.logprobs: k`), one definition for both engines.

**The definition** (vLLM's default, `logprobs_mode: raw_logprobs`, which the workflow pins): the
log-softmax of the model's logits at that position, after the structured output's mask when one is
set (so a constrained token's log-probability is that among the tokens its grammar allows), and
before repetition penalty, temperature, top_p and sampling. A sampled row's values are therefore
the model's, not the tempered distribution it was drawn from. The transformers engine reads them
with `LogprobRecorder`, a logits processor placed after the grammar mask and before the sampler.

**The column** (`logprobs`): per row a list over its generated tokens (eos included, as
`n_generated_tokens` counts it) of {token, token_id, logprob, top_logprobs}, where top_logprobs
lists the k most likely tokens at that position, most likely first ({token, token_id, logprob};
empty for k = 0). A token's text is `tokenizer.decode([id])` on both engines (a byte-level token
that is part of a UTF-8 character decodes to '�'; vLLM would give '').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

TOP = pa.struct([("token", pa.string()), ("token_id", pa.int32()), ("logprob", pa.float32())])
ENTRY = pa.struct([("token", pa.string()), ("token_id", pa.int32()), ("logprob", pa.float32()),
                   ("top_logprobs", pa.list_(TOP))])
LOGPROBS = pa.list_(ENTRY)  # one sample's tokens


@dataclass(frozen=True)
class SampleLogprobs:
    """One sample's log-probabilities: the chosen token's per position, and the top k ids and values
    per position (k columns, most likely first)."""

    chosen: np.ndarray  # float32 (steps,)
    top_ids: np.ndarray  # int32 (steps, k)
    top_values: np.ndarray  # float32 (steps, k)

    def first(self, steps: int) -> SampleLogprobs:
        return SampleLogprobs(self.chosen[:steps], self.top_ids[:steps], self.top_values[:steps])


class TokenTexts:
    """Each token id's text, decoded once per job (`tokenizer.decode([id])`), and a column of texts
    built by Arrow from the distinct ids: Python touches each distinct id, not each position."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.known = tokenizer, {}

    def of(self, ids: np.ndarray) -> pa.Array:
        distinct, inverse = np.unique(np.asarray(ids).reshape(-1), return_inverse=True)
        missing = [i for i in distinct.tolist() if i not in self.known]
        if missing:
            texts = self.tokenizer.batch_decode([[i] for i in missing], skip_special_tokens=False)
            self.known.update(zip(missing, texts))
        texts = pa.array([self.known[i] for i in distinct.tolist()], pa.string())
        return texts.take(pa.array(inverse.reshape(-1).astype(np.int64)))


def logprobs_array(tokens: list[np.ndarray], samples: list[SampleLogprobs | None], texts: TokenTexts) -> pa.Array:
    """One LOGPROBS value per sample (null for a sample whose row asked for none), built from flat
    arrays: no Python object per token."""
    asked = [(t, s) for t, s in zip(tokens, samples) if s is not None]
    ids = np.concatenate([np.asarray(t, dtype=np.int32) for t, _ in asked] or [np.zeros(0, np.int32)])
    chosen = np.concatenate([s.chosen for _, s in asked] or [np.zeros(0, np.float32)]).astype(np.float32)
    widths = np.concatenate([np.full(len(t), s.top_ids.shape[1], np.int32) for t, s in asked]
                            or [np.zeros(0, np.int32)])
    top_ids = np.concatenate([s.top_ids.reshape(-1) for _, s in asked] or [np.zeros(0, np.int32)]).astype(np.int32)
    top_values = np.concatenate([s.top_values.reshape(-1) for _, s in asked] or [np.zeros(0, np.float32)])
    top = pa.StructArray.from_arrays([texts.of(top_ids), pa.array(top_ids),
                                      pa.array(top_values.astype(np.float32))], fields=list(TOP))
    entries = pa.StructArray.from_arrays([texts.of(ids), pa.array(ids), pa.array(chosen),
                                          pa.ListArray.from_arrays(pa.array(offsets(widths)), top)], fields=list(ENTRY))
    lengths = [len(t) if s is not None else 0 for t, s in zip(tokens, samples)]
    missing = pa.array([s is None for s in samples]) if any(s is None for s in samples) else None
    return pa.ListArray.from_arrays(pa.array(offsets(lengths)), entries, mask=missing)


def offsets(lengths) -> np.ndarray:
    """List offsets for items of these lengths."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int32)


class LogprobRecorder:
    """A logits processor (after the grammar mask, before the sampler) that records per step each
    row's top k log-probabilities, and the log-softmax row only until the next step reads the chosen
    token from it: memory O(steps x rows x k), not x vocabulary."""

    def __init__(self, k: int) -> None:
        self.k, self.previous, self.chosen, self.top = k, None, [], []

    def __call__(self, input_ids, scores):
        import torch

        if self.previous is not None:  # the token chosen at the previous step is the last input id
            self.chosen.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        if self.k:
            values, ids = logprobs.topk(self.k, dim=-1)
            self.top.append((ids, values))
        self.previous = logprobs
        return scores

    def samples(self, sequences, counts: np.ndarray) -> list[SampleLogprobs]:
        """Each batch row's log-probabilities over its first `counts[r]` tokens (the last step's
        chosen token is read from `sequences`, whose last column it is)."""
        import torch

        if self.previous is not None:
            self.chosen.append(self.previous.gather(1, sequences[:, -1:]).squeeze(1))
            self.previous = None
        rows = sequences.shape[0]
        chosen = torch.stack(self.chosen, 1).cpu().numpy() if self.chosen else np.zeros((rows, 0), np.float32)
        if self.k:
            ids = torch.stack([i for i, _ in self.top], 1).cpu().numpy().astype(np.int32)
            values = torch.stack([v for _, v in self.top], 1).cpu().numpy()
        else:
            empty = (rows, chosen.shape[1], 0)
            ids, values = np.zeros(empty, np.int32), np.zeros(empty, np.float32)
        return [SampleLogprobs(chosen[r], ids[r], values[r]).first(int(counts[r])) for r in range(rows)]
