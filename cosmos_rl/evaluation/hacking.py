"""The reward-hacking watch: the training reward rising while the held-out score falls. Pure.

At each evaluation the watch records the training signal (its mean over the steps since the
previous evaluation: `train/reward_mean` for NFT, `train/dpo_reward_margin`, DPO's implicit
reward, for DPO) and `eval/score`. Over the last K evaluations (K = `rl.eval.hacking_window`), it
flags the run when the signal at the newest is above the signal at the oldest while the score at
the newest is below the score at the oldest. It warns once per occurrence: when the condition
starts to hold, not again while it keeps holding.

Worked example, K = 3, evaluations (signal, score): (0.2, 0.5), (0.3, 0.5), (0.4, 0.4) -> flagged
(0.2 -> 0.4 up, 0.5 -> 0.4 down); a fourth (0.5, 0.3) still holds, so no second warning; a fifth
(0.5, 0.6) clears it.
"""

from __future__ import annotations

import math
from typing import Sequence

DEFAULT_WINDOW = 3


def hacking(signal: Sequence[float], score: Sequence[float], window: int) -> bool:
    """Whether the last `window` evaluations show the signal up and the score down (oldest vs newest)."""
    if window < 2 or len(signal) < window or len(score) < window:
        return False
    first, last = signal[-window], signal[-1]
    before, after = score[-window], score[-1]
    if not all(math.isfinite(v) for v in (first, last, before, after)):
        return False
    return last > first and after < before


class HackingWatch:
    """Feed it one (step, signal, score) per evaluation; it returns a warning line when a new
    occurrence starts (see the module docstring), else None."""

    def __init__(self, window: int, signal_name: str):
        self.window, self.signal_name = window, signal_name
        self.steps: list[int] = []
        self.signal: list[float] = []
        self.score: list[float] = []
        self.active = False

    def observe(self, step: int, signal: float, score: float) -> str | None:
        self.steps.append(step)
        self.signal.append(signal)
        self.score.append(score)
        flagged = hacking(self.signal, self.score, self.window)
        starts = flagged and not self.active
        self.active = flagged
        if not starts:
            return None
        k = self.window
        return (
            f"possible reward hacking: {self.signal_name} rose {self.signal[-k]:.4g} -> {self.signal[-1]:.4g} "
            f"over the last {k} evaluations (steps {self.steps[-k]}-{self.steps[-1]}) while eval/score fell "
            f"{self.score[-k]:.4g} -> {self.score[-1]:.4g}; look at the samples before trusting the reward"
        )
