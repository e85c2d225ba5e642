"""The engine's outputs as the task's results, each checked against its row (the engine loop,
`shardinfer.engines.vllm.feeder`, matched them to their rows by request id, none missing or twice):
the prompt ids that were sent, the n completions asked (indices 0..n-1), each ended by eos, length
or stop. Any other answer fails the shard in one line naming the row. Log-probabilities are read
into the shape both engines give (`generate_logprobs.SampleLogprobs`).
"""

from __future__ import annotations

import numpy as np

from shardinfer.core.errors import UserError
from shardinfer.tasks.generate.columns import Completion, finish_code
from shardinfer.tasks.generate.logprobs import SampleLogprobs
from shardinfer.tasks.generate.params import RowParams


def rows_results(outputs: list, ids: list, index: list[int], eos_ids: list[int], params: list[RowParams]) -> dict:
    """The task's results of rows whose outputs are matched already (`outputs[p]` is row p's), each
    checked: the prompt ids that were sent, the row's n completions, each ended by eos, length or stop."""
    completions = []
    for p, output in enumerate(outputs):
        if list(output.prompt_token_ids) != list(map(int, ids[p])):
            raise UserError(f"row {index[p]}: vLLM ran other prompt token ids than were sent")
        completions.append(row_completions(output.outputs, params[p], eos_ids, index[p]))
    prompt_tokens = np.fromiter((len(row) for row in ids), dtype=np.int32, count=len(ids))
    return {"n_prompt_tokens": prompt_tokens, "completions": completions, "params": list(params)}


def engine_refused(output) -> bool:
    """Whether the engine ended a request with an error of its own (finish_reason `error`: a grammar
    it could not compile or follow for this row, ...): the row's failure, not a result."""
    return any(completion.finish_reason == "error" for completion in output.outputs)


def row_completions(outputs: list, params: RowParams, eos_ids: list[int], row: int) -> list[Completion]:
    """A row's n completions in order, each checked (vLLM numbers them 0..n-1)."""
    numbers = sorted(completion.index for completion in outputs)
    if numbers != list(range(params.n)):
        raise UserError(f"row {row}: vLLM returned completions {numbers}, not 0..{params.n - 1}")
    found = []
    for completion in sorted(outputs, key=lambda c: c.index):
        tokens = np.asarray(completion.token_ids, dtype=np.int64)
        finish = finish_code(completion.finish_reason, completion.stop_reason, eos_ids, params.stop, row, "vLLM")
        asked = params.logprobs is not None
        logprobs = sample_logprobs(completion.logprobs, tokens, params.logprobs, row) if asked else None
        found.append(Completion(tokens, finish, logprobs))
    return found


def sample_logprobs(positions, tokens: np.ndarray, k: int, row: int) -> SampleLogprobs:
    """vLLM's log-probabilities of a completion as the chosen token's and the top k's, most likely
    first. They come flat (`SamplingParams(flat_logprobs=True)`, `VllmGenerate.sampling_params`):
    per position k + 1 entries, the chosen token first, then the top k by rank (a chosen token among
    the top k comes twice, with one value), so the arrays are reshapes of vLLM's lists, without a
    Python object per position."""
    width = k + 1
    if positions is None or len(positions) != len(tokens):
        raise UserError(f"row {row}: vLLM returned log-probabilities for {0 if positions is None else len(positions)} "
                        f"of its {len(tokens)} tokens")
    starts = np.asarray(positions.start_indices, dtype=np.int64)
    if len(positions.token_ids) != width * len(tokens) or not np.array_equal(starts, np.arange(len(tokens)) * width):
        raise UserError(f"row {row}: vLLM returned other than the chosen and top {k} log-probabilities per position")
    ids = np.asarray(positions.token_ids, dtype=np.int64).reshape(len(tokens), width)
    values = np.asarray(positions.logprobs, dtype=np.float32).reshape(len(tokens), width)
    if not np.array_equal(ids[:, 0], tokens):
        raise UserError(f"row {row}: vLLM returned log-probabilities of other tokens than it generated")
    return SampleLogprobs(values[:, 0].copy(), ids[:, 1:].astype(np.int32), values[:, 1:].copy())
