"""Rewards that score whole clips: fn(clips, prompts) -> list[float], `clips` uint8 [N, F, H, W, 3]
(RGB) with one prompt per clip, one float per clip, higher is better.

Unlike an image reward scoring frame by frame (`cosmos_rl.rewards.frames`), a clip reward sees
time: a shuffled clip keeps every frame's image score and loses its video score.

The shapes world's video verifier is named by an import string, imported on its first call, so
the service starts (and serves image rewards) without importing it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Sequence

import numpy as np

VideoRewardFn = Callable[[np.ndarray, Sequence[str]], list[float]]

# `module:function` of score_clips(clips, captions, mode="strict" | "partial") -> list[float].
SHAPES_VIDEO_SCORER = "cosmos_rl.shapes.motion_verifier:score_clips"
# The same, with frame 0 judged against the world's first frame of the caption (image-to-video).
SHAPES_I2V_SCORER = "cosmos_rl.shapes.first_frame_check:score_i2v_clips"


def check_clips(clips: np.ndarray, prompts: Sequence[str]) -> None:
    """Raise ValueError unless `clips` is uint8 [N, F, H, W, 3] with one prompt per clip."""
    if not isinstance(clips, np.ndarray) or clips.dtype != np.uint8:
        got = type(clips).__name__ if not isinstance(clips, np.ndarray) else clips.dtype
        raise ValueError(f"clips must be a uint8 numpy array, got {got}; use to_uint8() first")
    if clips.ndim != 5 or clips.shape[-1] != 3 or clips.shape[1] < 1:
        raise ValueError(f"clips must be shaped [N, F, H, W, 3] with F >= 1, got {clips.shape}")
    if len(prompts) != clips.shape[0]:
        raise ValueError(f"got {clips.shape[0]} clips but {len(prompts)} prompts")


class ImportedScorer:
    """A clip reward whose scorer `module:function` is imported on the first call and then called
    as function(clips, prompts, mode=mode)."""

    def __init__(self, target: str, mode: str):
        module, sep, function = target.partition(":")
        if not (module and sep and function):
            raise ValueError(f"scorer {target!r} must be 'module:function'")
        self.target, self.mode = target, mode
        self._function = None
        self._lock = threading.Lock()

    def resolve(self) -> Callable:
        with self._lock:
            if self._function is None:
                module, _, name = self.target.partition(":")
                try:
                    self._function = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError) as exc:
                    # A service built without the scorer: a fault of the service, never of the request.
                    raise RuntimeError(f"the clip scorer {self.target} cannot be loaded ({exc})") from None
            return self._function

    def __call__(self, clips: np.ndarray, prompts: Sequence[str]) -> list[float]:
        check_clips(clips, prompts)
        return [float(s) for s in self.resolve()(clips, list(prompts), mode=self.mode)]


def video_rewards(scorer: str = SHAPES_VIDEO_SCORER, i2v_scorer: str = SHAPES_I2V_SCORER) -> dict[str, VideoRewardFn]:
    """The built-in clip rewards: the shapes video verifier's strict and partial scores, and its
    image-to-video ones (`cosmos_rl.shapes.first_frame_check`)."""
    return {
        "shapes_video_strict": ImportedScorer(scorer, "strict"),  # every clause of the caption met over the clip
        "shapes_video_partial": ImportedScorer(scorer, "partial"),  # the fraction met
        # I2V NFT (model.condition.source = "shapes_video"): also frame 0 keeps the world's first frame's objects
        "shapes_video_i2v_strict": ImportedScorer(i2v_scorer, "strict"),
        "shapes_video_i2v_partial": ImportedScorer(i2v_scorer, "partial"),
    }
