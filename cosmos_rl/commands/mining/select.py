"""Which two of a prompt's K scored samples make a preference pair. Pure; no torch."""

from __future__ import annotations

from typing import Optional, Sequence


def best_vs_worst(scores: Sequence[float]) -> Optional[tuple[int, int]]:
    """(winner, loser) sample indices: the highest and the lowest score, the first of each on equal
    scores (so the choice never depends on anything but the scores' order), or None when every
    sample scored the same: a tie says nothing about which image is better.

    best_vs_worst([0.2, 0.9, 0.1, 0.9]) -> (1, 2); best_vs_worst([1, 1]) -> None.
    """
    if len(scores) < 2:
        raise ValueError(f"a pair needs at least 2 samples, got {len(scores)}")
    values = [float(s) for s in scores]
    if any(v != v for v in values):
        raise ValueError(f"scores must be numbers, got {values}")
    high, low = max(values), min(values)
    if high == low:
        return None
    return values.index(high), values.index(low)
