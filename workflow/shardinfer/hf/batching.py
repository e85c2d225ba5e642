"""Length-sorted batches under a token budget, and padding to the longest row of each batch.

Sorting by length puts rows of similar length together, so a batch pads little; cutting by a
budget of padded tokens keeps every batch about the same cost. Where to cut is a small shortest-
path problem over the sorted rows: each batch costs its padded tokens plus a fixed overhead, so a
steep stretch of the length tail is cut into more, tighter batches and a flat stretch into full
ones. Callers restore input order by writing each batch's results back at the row positions the
batch carries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BATCH_OVERHEAD = 1 / 64  # one more batch costs as much as padding 1/64 of the token budget
WIDE_BUDGET = 16384  # `batch.max_tokens: auto` on a GPU, and for tasks that loop over a batch (generate)
CPU_BUDGET_PER_THREAD = 1024  # `auto` on CPU for one forward pass per batch


def batch_budget(max_tokens: int | str, on_gpu: bool, threads: int, one_pass: bool) -> int:
    """`batch.max_tokens` for this job: the configured number, or for `auto` what its device runs
    fastest. A GPU needs wide batches to fill its cores. A CPU core does not: there, one forward
    pass per batch (classify, embed, score) runs fastest when its activations stay in cache
    (all-MiniLM-L6-v2, texts of ~34 tokens: 1 thread 9% faster at 1,024-2,048 tokens than at 16,384,
    and with two such jobs at once 1,024 6% faster than 2,048; 2 threads 1,024-2,048 tokens 10%
    faster than 4,096). Generation keeps wide batches on CPU too: each decoding step costs a fixed
    overhead per batch."""
    if max_tokens != "auto":
        return int(max_tokens)
    if on_gpu or not one_pass:
        return WIDE_BUDGET
    return min(WIDE_BUDGET, CPU_BUDGET_PER_THREAD * max(1, threads))


def row_capacity(width: np.ndarray, max_tokens: int, max_rows: int) -> np.ndarray:
    """Rows a batch may hold when its longest row has `width` tokens (at least one)."""
    return np.clip(max_tokens // np.maximum(width, 1), 1, max_rows)


def sorted_pieces(widths: np.ndarray, max_tokens: int, max_rows: int) -> np.ndarray:
    """Cut points over rows sorted longest first: every change of length, and inside a run of
    equal lengths every `capacity` rows. Batches are built from whole pieces."""
    change = np.flatnonzero(np.diff(widths)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(widths)]])
    cuts = [np.arange(a, b, row_capacity(widths[a], max_tokens, max_rows)) for a, b in zip(starts, ends)]
    return np.concatenate([*cuts, [len(widths)]])


def cheapest_cuts(widths: np.ndarray, cuts: np.ndarray, max_tokens: int, max_rows: int) -> list[int]:
    """Cut points (a subset of `cuts`) minimising padded tokens + an overhead per batch. Rows of one
    width (`widths` sorted longest first) are cut into full batches already: every cut is kept."""
    if widths[0] == widths[-1]:
        return cuts.tolist()
    overhead = max_tokens * BATCH_OVERHEAD
    capacity = row_capacity(widths[cuts[:-1]], max_tokens, max_rows)
    best, previous = np.zeros(len(cuts)), np.zeros(len(cuts), dtype=np.int64)
    for b in range(1, len(cuts)):
        lo = int(np.searchsorted(cuts, cuts[b] - max_rows))  # no batch holds more than max_rows
        rows = cuts[b] - cuts[lo:b]
        cost = best[lo:b] + rows * widths[cuts[lo:b]] + overhead
        cost[rows > capacity[lo:b]] = np.inf
        previous[b] = lo + int(np.argmin(cost))
        best[b] = cost[previous[b] - lo]
    chosen, b = [len(cuts) - 1], len(cuts) - 1
    while b > 0:
        b = previous[b]
        chosen.append(b)
    return [int(cuts[i]) for i in reversed(chosen)]


def length_sorted_batches(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[np.ndarray]:
    """Row positions per batch, longest rows first; padded tokens per batch stay <= max_tokens.

    A single row longer than the budget still gets a batch of its own: no row is ever dropped.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return []
    order = np.argsort(-lengths, kind="stable")
    widths = np.maximum(lengths[order], 1)
    bounds = cheapest_cuts(widths, sorted_pieces(widths, max_tokens, max_rows), max_tokens, max_rows)
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def padded_tokens(lengths: Sequence[int], batches: Sequence[np.ndarray]) -> int:
    """Tokens processed, padding included: each batch's longest row times its rows."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return 0
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    longest = np.maximum.reduceat(np.take(np.asarray(lengths, dtype=np.int64), np.concatenate(batches)), starts)
    return int((longest * sizes).sum())


def padding_ratio(lengths: Sequence[int], batches: Sequence[np.ndarray]) -> float:
    """Tokens processed (padding included) per real token."""
    real = int(np.sum(lengths))
    return padded_tokens(lengths, batches) / real if real else 1.0


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
