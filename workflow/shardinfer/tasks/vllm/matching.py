"""The engine's outputs matched to the rows that were sent, by request id, each checked: one per
row, none missing or twice, the prompt ids that were sent, one completion that ended by eos,
length or stop. Any other answer fails the shard in one line naming the row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardinfer.errors import UserError
from shardinfer.tasks.generate import FINISH


def matched_results(request_ids: list[str], outputs: list, ids: list, index: list[int], eos_ids: list[int],
                    stops: list[str] = ()) -> dict:
    """The engine's outputs in the rows' order, each checked: one per request id, none missing or
    twice, the prompt ids that were sent, one completion that ended by eos, length or stop."""
    if len(request_ids) != len(ids):
        raise UserError(f"vLLM accepted {len(request_ids)} of {len(ids)} prompts (rows {index[0]}..{index[-1]})")
    position = {external_id(rid): p for p, rid in enumerate(request_ids)}
    if len(position) != len(ids):
        raise UserError(f"vLLM gave {len(ids)} prompts {len(position)} distinct request ids "
                        f"(rows {index[0]}..{index[-1]})")
    found: list[Any] = [None] * len(ids)
    for output in outputs:
        p = position.get(output.request_id)
        if p is None:
            raise UserError(f"vLLM returned an output for request {output.request_id!r}, which this shard did not send")
        if found[p] is not None:
            raise UserError(f"vLLM returned row {index[p]} twice")
        found[p] = output
    missing = [index[p] for p, output in enumerate(found) if output is None]
    if missing:
        raise UserError(f"vLLM returned no output for {len(missing)} row(s), first {missing[:5]}")
    tokens, finish = [], np.zeros(len(ids), dtype=np.int8)
    for p, output in enumerate(found):
        if list(output.prompt_token_ids) != list(map(int, ids[p])):
            raise UserError(f"row {index[p]}: vLLM ran other prompt token ids than were sent")
        if len(output.outputs) != 1:
            raise UserError(f"row {index[p]}: vLLM returned {len(output.outputs)} completions, not 1")
        completion = output.outputs[0]
        finish[p] = finish_code(completion.finish_reason, completion.stop_reason, eos_ids, stops, index[p])
        tokens.append(np.asarray(completion.token_ids, dtype=np.int64))
    prompt_tokens = np.fromiter((len(row) for row in ids), dtype=np.int32, count=len(ids))
    return {"tokens": tokens, "n_prompt_tokens": prompt_tokens, "finish": finish}


def external_id(request_id: str) -> str:
    """The id an output carries for a request `enqueue` named: vLLM adds `-` and 8 random
    characters to its own counter's id inside the engine (unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION)."""
    head, dash, tail = request_id.rpartition("-")
    return head if dash and len(tail) == 8 else request_id


def finish_code(reason: str | None, stop_reason, eos_ids: list[int], stops, row: int) -> int:
    """vLLM's ending as ours: `stop` by an eos token (stop_reason None: the tokenizer's, or an eos id)
    is eos, by one of `stops` (stop_reason: the string) is stop; `length` is length; any other fails."""
    if reason == "length":
        return FINISH.index("length")
    if reason == "stop" and (stop_reason is None or stop_reason in eos_ids):
        return FINISH.index("eos")
    if reason == "stop" and stop_reason in stops:
        return FINISH.index("stop")
    raise UserError(f"row {row}: vLLM ended it with finish_reason {reason!r} (stop_reason {stop_reason!r}); "
                    "only eos, length and stop are results")
