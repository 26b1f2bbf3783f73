"""The learning-rate schedule as a pure function of the optimizer step (no torch), so preflight can
say where a run ends on it and the trainers' LambdaLR rebuilds it from the config on resume (the
checkpoint stores only the step counter)."""

from __future__ import annotations

import math
from typing import Callable

from cosmos_rl.core import schema


def lr_factor(cfg: schema.OptimizerConfig) -> Callable[[int], float]:
    """LR multiplier at optimizer step k (counted from 0): a linear ramp (k + 1) / warmup_steps over
    the warm-up, then 1, or with a decay the fraction p = (k - warmup_steps) / (decay_steps -
    warmup_steps) of the way from 1 down to min_lr_ratio (linear: 1 - p; cosine: (1 + cos(pi p)) / 2),
    held at min_lr_ratio from decay_steps on."""
    warmup, end, floor = cfg.warmup_steps, cfg.decay_steps, cfg.min_lr_ratio

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if cfg.decay == "none":
            return 1.0
        progress = min(1.0, (step - warmup) / (end - warmup))
        shape = 1.0 - progress if cfg.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return floor + (1.0 - floor) * shape

    return factor
