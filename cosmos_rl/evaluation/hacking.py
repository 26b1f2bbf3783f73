"""The reward-hacking watch: the training reward rising while the held-out score falls, judged
against the noise of each; and, on a run of several rewards, one reward (dimension) collapsing
while the total rises. Pure (numpy).

At each evaluation the watch records the training signal (its per-step values over the steps since
the previous evaluation: `train/reward_mean` for NFT, `train/dpo_reward_margin`, DPO's implicit
reward, for DPO), each reward dimension's per-step values (`train/<name>/reward_mean`, a run with
several `[[rl.rewards]]`), and the held-out score's per-prompt values (the mean over its seeds, by
task). Over the last K evaluations (K = `rl.eval.hacking_window`) it compares the newest with the
oldest:

* **held-out score** (`warn`): the signal's mean since the newest evaluation is above its mean since
  the oldest, and the held-out score **fell beyond its noise**: the paired difference newest - oldest
  over the same prompts (`intervals.paired`, the prompt-bootstrap of `cosmos-rl eval`) has its
  whole 95% interval below 0. A drop inside the interval is noise and says nothing. Worked example
  (tests/test_hacking.py): one task of ten prompts scoring 1,0,1,0,... at the oldest evaluation; at
  the newest one of the five 1s is 0: the per-prompt differences are nine 0s and one -1, a
  resample's mean is -k/10 with k ~ Binomial(10, 0.1), P(k = 0) ~ 35% > 2.5%, so the interval's
  upper end is 0: not below 0, no warning. With all five 1s at 0, k ~ Binomial(10, 1/2) and the
  interval is [-0.8, -0.2] (the worked example of `evaluation.intervals`): a warning.
* **a dimension** (`dimension_warn`): the total signal rose as above while one dimension
  **collapsed**: the least-squares slope of its per-step values over the window's steps (those
  since the evaluation before the window's oldest) is below 0 with its whole 95% interval (slope
  +- t(0.975, n - 2) x its standard error; n >= 3 steps). E.g. per-step values 1.0, 0.5, 0.0 fall
  with no scatter: slope -0.5, standard error 0, collapsed; 0.5, 0.3, 0.6 do not.

It warns once per occurrence (per dimension for the dimension rule): when the condition starts to
hold, not again while it keeps holding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from cosmos_rl.evaluation.intervals import Interval, paired

DEFAULT_WINDOW = 3
PromptScores = Mapping[str, Sequence[float]]  # {task: per-prompt held-out scores, in prompt order}


def score_drop(before: PromptScores, after: PromptScores) -> tuple[float, Interval]:
    """(the held-out score's change after - before, its 95% paired-bootstrap interval); the overall
    score is the unweighted mean of task means, as `cosmos-rl eval` reports it."""
    a = {task: np.asarray(after[task], dtype=np.float64) for task in before}
    b = {task: np.asarray(before[task], dtype=np.float64) for task in before}
    if set(after) != set(before):
        raise ValueError(f"the evaluations scored different tasks: {sorted(before)} then {sorted(after)}")
    change = float(np.mean([a[t].mean() - b[t].mean() for t in b]))
    return change, paired(a, b).overall


def fell(before: PromptScores, after: PromptScores) -> bool:
    """Whether the held-out score fell beyond its noise: the whole interval of the change below 0."""
    return score_drop(before, after)[1][1] < 0


def slope(values: Sequence[float]) -> tuple[float, Interval]:
    """(the least-squares slope of `values` against 0, 1, 2, ..., its 95% t-interval); needs 3 values."""
    from scipy import stats

    y = np.asarray(values, dtype=np.float64)
    n = len(y)
    if n < 3:
        raise ValueError(f"a slope's interval needs at least 3 values, got {n}")
    x = np.arange(n, dtype=np.float64) - (n - 1) / 2
    b = float((x * (y - y.mean())).sum() / (x * x).sum())
    residual = y - y.mean() - b * x
    se = math.sqrt(float((residual * residual).sum()) / (n - 2) / float((x * x).sum()))
    half = float(stats.t.ppf(0.975, n - 2)) * se
    return b, (b - half, b + half)


def collapsed(values: Sequence[float]) -> bool:
    """Whether a dimension's per-step values fall beyond their scatter (module docstring); False
    with fewer than 3 values or a non-finite one (nothing to judge)."""
    if len(values) < 3 or not all(math.isfinite(v) for v in values):
        return False
    return slope(values)[1][1] < 0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class Evaluation:
    """What the watch keeps of one evaluation."""

    step: int
    signal: tuple[float, ...]  # the training signal at each step since the previous evaluation
    score: float  # the held-out score (eval/score)
    prompts: dict[str, tuple[float, ...]]  # its per-prompt values by task
    dimensions: dict[str, tuple[float, ...]] = field(default_factory=dict)  # each dimension's per-step values


def rose(window: Sequence[Evaluation]) -> bool:
    """Whether the training signal's mean since the newest evaluation is above its mean since the oldest."""
    first, last = _mean(window[0].signal), _mean(window[-1].signal)
    return math.isfinite(first) and math.isfinite(last) and last > first


class HackingWatch:
    """Feed it one `Evaluation` at a time; it returns the warning lines of occurrences that start
    (see the module docstring), the held-out one first, then one per dimension in name order."""

    def __init__(self, window: int, signal_name: str, score_name: str = "eval/score"):
        self.window, self.signal_name, self.score_name = window, signal_name, score_name
        self.seen: list[Evaluation] = []
        self.active = False
        self.active_dims: set[str] = set()

    def observe(self, evaluation: Evaluation) -> list[str]:
        self.seen.append(evaluation)
        k = self.window
        if k < 2 or len(self.seen) < k:
            return []
        window = self.seen[-k:]
        first, last = window[0], window[-1]
        lines = []
        up = rose(window)
        flagged = up and fell(first.prompts, last.prompts)
        if flagged and not self.active:
            change, (lo, hi) = score_drop(first.prompts, last.prompts)
            lines.append(
                f"possible reward hacking: {self.signal_name} rose {_mean(first.signal):.4g} -> {_mean(last.signal):.4g} "
                f"over the last {k} evaluations (steps {first.step}-{last.step}) while {self.score_name} fell "
                f"{first.score:.4g} -> {last.score:.4g} (change {change:+.4f}, 95% interval [{lo:+.4f}, {hi:+.4f}], "
                f"below 0 beyond its noise); look at the samples before trusting the reward"
            )
        self.active = flagged
        for name in sorted(last.dimensions):
            steps = [v for e in window for v in e.dimensions.get(name, ())]
            down = up and collapsed(steps)
            if down and name not in self.active_dims:
                b, (lo, hi) = slope(steps)
                lines.append(
                    f"possible reward hacking: reward dimension {name!r} collapsed at step {last.step} "
                    f"({_mean(first.dimensions.get(name, ())):.4g} -> {_mean(last.dimensions[name]):.4g}, "
                    f"slope {b:+.4g} a step, 95% interval [{lo:+.4g}, {hi:+.4g}], over the {len(steps)} steps "
                    f"up to step {last.step}) while {self.signal_name} rose {_mean(first.signal):.4g} -> "
                    f"{_mean(last.signal):.4g}; the total hides it: look at that reward's samples"
                )
            (self.active_dims.add if down else self.active_dims.discard)(name)
        return lines
