"""A row's estimated cost and the shards' ranges of balanced cost: what the plan cuts the input by,
before any tokenizer is loaded (so planning never imports torch). `shardinfer.plan.plan_file` records the
ranges and each shard's cost, with `COST_ESTIMATE` saying how they were counted."""

from __future__ import annotations

import numpy as np

from shardinfer.core.errors import UserError

CHARS_PER_TOKEN = 4
SPECIAL_TOKENS = 2
COST_ESTIMATE = (f"tokens per row ~ ceil(characters / {CHARS_PER_TOKEN}) + {SPECIAL_TOKENS}, at most max_length, "
                 "+ the task's overhead per row (generate: max_new_tokens) + tokens per image (input.image_column)")


def estimated_tokens(chars: np.ndarray, max_length: int) -> np.ndarray:
    """A row's cost before any tokenizer is loaded: its characters over ~4 per token, plus the
    special tokens, cut at max_length as the tokenizer will cut it. Never below one."""
    tokens = chars.astype(np.int64)  # in place from here: one array of 16M rows, not one per step
    tokens += CHARS_PER_TOKEN - 1  # ceil(chars / 4) for chars >= 0
    tokens //= CHARS_PER_TOKEN
    tokens += SPECIAL_TOKENS
    return np.clip(tokens, 1, max(max_length, 1), out=tokens)


def balanced_ranges(costs: np.ndarray, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous [start, end) ranges over the rows, each holding about the same total cost.

    Each cut goes to the row boundary nearest its share of the running total, so a shard's cost
    is off its share by at most one row's cost; equal costs give sizes within one row. No shard
    is empty while there are at least as many rows as shards (one very long row gets a shard of
    its own instead); with fewer rows, the extra shards are empty.
    """
    if shards < 1:
        raise UserError(f"shards must be an integer >= 1; got {shards!r}")
    rows = len(costs)
    before = np.concatenate([[0], np.cumsum(costs, dtype=np.int64)])  # before[i]: cost of rows < i
    targets = before[-1] * np.arange(1, shards) / shards
    after = np.searchsorted(before, targets, side="left").clip(max=rows)
    nearer_before = (after > 0) & (targets - before[np.maximum(after - 1, 0)] < before[after] - targets)
    cuts = np.maximum.accumulate(np.where(nearer_before, after - 1, after)).tolist()
    if rows >= shards:
        for k in range(len(cuts)):  # cut k ends shard k: at least one row before it and after it
            lowest = cuts[k - 1] + 1 if k else 1
            cuts[k] = min(max(cuts[k], lowest), rows - (shards - 1 - k))
    bounds = [0, *(int(c) for c in cuts), rows]
    return list(zip(bounds[:-1], bounds[1:]))
