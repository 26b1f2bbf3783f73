"""A stand-in clip scorer with the shapes video verifier's signature, for the reward service tests
(they never import the real verifier): a clip "shows motion" when its frames grow brighter.

    score_clips(clips, captions, mode) -> list[float]
    strict:  1.0 when every step from frame to frame is brighter, else 0.0
    partial: the fraction of steps that are brighter
"""

from __future__ import annotations

import numpy as np


def score_clips(clips: np.ndarray, captions, mode: str = "strict") -> list[float]:
    if mode not in ("strict", "partial"):
        raise ValueError(f"mode must be strict or partial, got {mode!r}")
    means = clips.reshape(clips.shape[0], clips.shape[1], -1).mean(axis=2)
    rising = np.diff(means, axis=1) > 0
    if mode == "strict":
        return [float(row.all()) for row in rising]
    return [float(row.mean()) if row.size else 1.0 for row in rising]
