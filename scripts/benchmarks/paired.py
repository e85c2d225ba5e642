"""Paired rounds: what a benchmark compares, measured against drift.

On a shared or virtual machine the same run swings by 10% and more from one minute to the next,
more than the differences the benchmarks look for. Each benchmark runs its variants in rounds,
one after another; a variant's ratio to its reference is taken within each round (the two ran a
minute apart) and the median of the rounds' ratios is what it reports, beside the fastest runs'.
"""

from __future__ import annotations

import statistics


def round_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Each round's ratio (the lists in round order, one value per round)."""
    return [n / max(d, 1e-9) for n, d in zip(numerators, denominators, strict=True)]


def median_ratio(numerators: list[float], denominators: list[float]) -> str:
    """'1.03x (median of 5 rounds, 0.98..1.07)'."""
    ratios = round_ratios(numerators, denominators)
    spread = f", {min(ratios):.2f}..{max(ratios):.2f}" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.3f}x (median of {len(ratios)} round{'s' * (len(ratios) > 1)}{spread})"
