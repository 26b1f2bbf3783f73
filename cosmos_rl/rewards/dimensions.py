"""Rewards that score several named dimensions (VideoAlign's VQ, MQ, TA) besides their one score.

Such a reward's function returns a `Scored` instead of a list of floats: `scores` is what training
sums (its score), `dimensions` one list per dimension name, each with one value per sample. A
reward registers its dimension names (`registry.Reward.dimensions`); the service lists them in /info
(`"dimensions": {reward: [name, ...]}`, only when some reward has any) and returns each request's
values beside the scores (`"dimensions": {name: [float, ...]}`); the client hands them on
(`RewardClient.score_dimensions`), and a run logs each as its own reward metric,
`train/<reward>.<dimension>/reward_mean` (`metric_name`). A reward without dimensions returns a
plain list and its answers carry no `dimensions` key, as before.
"""

from __future__ import annotations

import math

import attrs


@attrs.frozen
class Scored:
    """One score per sample, and each named dimension's values per sample."""

    scores: list[float]
    dimensions: dict[str, list[float]]


def metric_name(reward: str, dimension: str) -> str:
    """The name a dimension's table has among a run's reward tables (`reward.dimension`)."""
    return f"{reward}.{dimension}"


def split(result) -> tuple[list[float], dict[str, list[float]]]:
    """(scores, dimensions) of what a reward function returned (a list: no dimensions)."""
    if isinstance(result, Scored):
        return list(result.scores), {k: list(v) for k, v in result.dimensions.items()}
    return list(result), {}


def problem(dimensions: object, names, count: int) -> str | None:
    """Why `dimensions` is not {name: `count` finite numbers} for exactly `names`, or None."""
    if not isinstance(dimensions, dict) or sorted(dimensions) != sorted(names):
        shown = sorted(dimensions) if isinstance(dimensions, dict) else type(dimensions).__name__
        return f"dimensions {shown} are not the declared {sorted(names)}"
    for name, values in dimensions.items():
        if not isinstance(values, list) or len(values) != count:
            return f"dimension {name!r} holds {len(values) if isinstance(values, list) else type(values).__name__} values for {count} samples"
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            return f"dimension {name!r} holds non-finite or non-numeric values"
    return None
