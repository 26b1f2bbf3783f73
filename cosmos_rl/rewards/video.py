"""Rewards that score whole clips: fn(clips, prompts) -> list[float], `clips` uint8 [N, F, H, W, 3]
(RGB) with one prompt per clip, one float per clip, higher is better.

Unlike an image reward scoring frame by frame (`cosmos_rl.rewards.frames`), a clip reward sees
time: a shuffled clip keeps every frame's image score and loses its video score. The clip rewards
the service offers are those of the suites that judge clips (`rewards.registry`, `cosmos_rl.suites`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

VideoRewardFn = Callable[[np.ndarray, Sequence[str]], list[float]]


def check_clips(clips: np.ndarray, prompts: Sequence[str]) -> None:
    """Raise ValueError unless `clips` is uint8 [N, F, H, W, 3] with one prompt per clip."""
    if not isinstance(clips, np.ndarray) or clips.dtype != np.uint8:
        got = type(clips).__name__ if not isinstance(clips, np.ndarray) else clips.dtype
        raise ValueError(f"clips must be a uint8 numpy array, got {got}; use to_uint8() first")
    if clips.ndim != 5 or clips.shape[-1] != 3 or clips.shape[1] < 1:
        raise ValueError(f"clips must be shaped [N, F, H, W, 3] with F >= 1, got {clips.shape}")
    if len(prompts) != clips.shape[0]:
        raise ValueError(f"got {clips.shape[0]} clips but {len(prompts)} prompts")
