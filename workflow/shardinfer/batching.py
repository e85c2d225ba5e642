"""Length-sorted batches under a token budget, and padding to the longest row of each batch.

Sorting by length puts rows of similar length together, so a batch pads little; cutting by a
budget of padded tokens keeps every batch about the same cost. Callers restore input order by
writing each batch's results back at the row positions the batch carries.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def length_sorted_batches(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[np.ndarray]:
    """Row positions per batch, longest rows first; padded tokens per batch stay <= max_tokens.

    A single row longer than the budget still gets a batch of its own: no row is ever dropped.
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(max_rows, max_tokens // longest))
        batches.append(order[start : start + size])
        start += size
    return batches


def padding_ratio(lengths: Sequence[int], batches: Sequence[np.ndarray]) -> float:
    """Tokens processed (padding included) per real token."""
    real = int(np.sum(lengths))
    padded = sum(int(np.max(np.take(lengths, b))) * len(b) for b in batches)
    return padded / real if real else 1.0


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask padded to the batch's longest row (never to max_length)."""
    width = max(len(row) for row in ids)
    input_ids = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for i, row in enumerate(ids):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        input_ids[i, span] = row
        mask[i, span] = 1
    return input_ids, mask
