"""Several rewards, one advantage: the two ways `rl.reward_combine` allows, and their metrics.

Pure functions of [num_prompts, group_size] reward tables keyed by reward name (no model, no
service). `group_advantages` (cosmos_rl.algorithms.nft) does the per-group normalising.

    weighted_sum     A = adv(sum_k w_k R_k)
    normalised_sum   A = sum_k w_k adv(R_k)

With weighted_sum a reward on a larger scale (or with a larger spread) decides the ordering
within a group alone; a summed harder reward then stalls. normalised_sum gives each reward
unit-scale advantages first, so the weights alone say how much each one counts.

Worked example (std_scope = "batch", eps = 0, two prompts of two samples, w = {a: 1, b: 0.5}):
    R_a = [[0, 2], [0, 2]]   batch std 1                    adv(R_a) = [[-1, 1], [-1, 1]]
    R_b = [[6, 0], [3, 3]]   batch std sqrt(4.5) = 2.1213   adv(R_b) = [[1.4142, -1.4142], [0, 0]]
    normalised_sum = adv(R_a) + 0.5 adv(R_b) = [[-0.2929, 0.2929], [-1, 1]]
    weighted_sum:  R_a + 0.5 R_b = [[3, 2], [1.5, 3.5]], group means 2.5, batch std sqrt(0.625)
                   = 0.7906, so A = [[0.6325, -0.6325], [-1.2649, 1.2649]]
In the first prompt weighted_sum lets b (weight 0.5, but on a three times larger scale) override
a's preference for sample 1; normalised_sum follows the weights, and a's preference wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from cosmos_rl.algorithms.nft import group_advantages

COMBINE_MODES = ("weighted_sum", "normalised_sum")


def _checked(rewards: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> list[str]:
    if not rewards:
        raise ValueError("no rewards to combine")
    if set(rewards) != set(weights):
        raise ValueError(f"rewards {sorted(rewards)} and weights {sorted(weights)} must name the same rewards")
    shapes = {tuple(t.shape) for t in rewards.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"every reward table must share one [num_prompts, group_size] shape, got {sorted(shapes)}")
    for name, w in weights.items():
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"weight of {name!r} must be a finite number > 0, got {w}")
    return sorted(rewards)


def weighted_reward(rewards: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> torch.Tensor:
    """sum_k w_k R_k, [num_prompts, group_size] in float64 (the run's `train/reward_mean` is its mean)."""
    names = _checked(rewards, weights)
    return sum(weights[n] * rewards[n].to(torch.float64) for n in names)


def combined_advantages(
    rewards: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    mode: str,
    std_scope: str = "batch",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Advantages [num_prompts, group_size] from several reward tables (see the module docstring)."""
    names = _checked(rewards, weights)
    if mode == "weighted_sum":
        return group_advantages(weighted_reward(rewards, weights), eps=eps, std_scope=std_scope)
    if mode == "normalised_sum":
        return sum(
            weights[n] * group_advantages(rewards[n].to(torch.float64), eps=eps, std_scope=std_scope) for n in names
        )  # fmt: skip
    raise ValueError(f"mode must be one of {list(COMBINE_MODES)}, got {mode!r}")


def reward_metric_names(name: str) -> tuple[str, str]:
    """The per-reward metrics: `train/<name>/reward_mean`, `train/<name>/reward_std`."""
    return f"train/{name}/reward_mean", f"train/{name}/reward_std"


def reward_metrics(rewards: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Mean and population std of each reward's table, under `reward_metric_names`."""
    out = {}
    for name in sorted(rewards):
        table = rewards[name].to(torch.float64)
        mean_key, std_key = reward_metric_names(name)
        out[mean_key] = float(table.mean())
        out[std_key] = float(table.std(unbiased=False))
    return out
