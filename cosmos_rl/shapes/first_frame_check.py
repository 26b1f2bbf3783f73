"""Image-to-video verdicts: the moving-shapes verdict plus "frame 0 keeps the conditioning frame's objects".

An I2V clip is conditioned on a first frame; a clip that meets its caption with other objects
than that frame's (the model ignoring the condition) has not done the task. So the verdict of
:func:`verify_i2v_clips` is the video verifier's (:mod:`cosmos_rl.shapes.motion_verifier`) with
one more constraint, met when the objects found in the clip's frame 0 are those found in the
conditioning frame: one to one, the same shape and colour, centres at most
:data:`CENTRE_TOLERANCE` of the shorter side apart (1.6 px at 32: an object the VAE blurs by a
pixel still matches; one moved by a step of its motion does not). ``partial`` = met / (total +
1); ``strict`` also needs frame 0 to match.

The built-in rewards ``shapes_video_i2v_strict`` and ``shapes_video_i2v_partial`` (:func:`score_i2v_clips`)
see only clips and captions, so they judge frame 0 against the world's ground-truth first frame
of the caption at seed 0, which is the frame an NFT run with ``model.condition.source = "shapes_video"``
conditions its rollouts on.

Worked example: "a red circle moving left" conditioned on a red circle at (20, 16); a clip whose
frame 0 has it at (20, 16) and that moves it left meets 3/3; the same clip starting from a red
circle at (10, 16) meets 2/3 ("frame 0 lost ... / frame 0 has ...": one failure).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cosmos_rl.shapes.analyse import COLOUR_TOLERANCE, Found, detect
from cosmos_rl.shapes.motion_verifier import MODES, check_clips, verify_clips
from cosmos_rl.shapes.verifier import Verdict

CENTRE_TOLERANCE = 0.05  # of the shorter side
WORLD_SEED = 0  # the ground-truth clip whose frame 0 an I2V run from the shapes_video suite is given and the rewards compare with


def first_frame_failure(frame0: Sequence[Found], condition: Sequence[Found], height: int, width: int) -> str | None:
    """None when `frame0`'s objects are `condition`'s (module docstring), else what differs, in words."""
    reach = CENTRE_TOLERANCE * min(height, width)
    left = list(frame0)
    lost = []
    for want in condition:
        fits = [i for i, obj in enumerate(left) if obj.shape == want.shape and obj.colour == want.colour
                and max(abs(obj.x - want.x), abs(obj.y - want.y)) <= reach]  # fmt: skip
        if not fits:
            lost.append(want)
            continue
        left.pop(min(fits, key=lambda i: (left[i].x - want.x) ** 2 + (left[i].y - want.y) ** 2))
    if not lost and not left:
        return None
    words = [f"frame 0 lost the conditioning frame's {obj.describe()}" for obj in lost]
    words += [f"frame 0 has a {obj.describe()} the conditioning frame lacks" for obj in left]
    return "; ".join(words)


def verify_i2v_clips(clips: np.ndarray, captions: Sequence[str], first_frames: np.ndarray,
                     tolerance: float = COLOUR_TOLERANCE) -> list[Verdict]:  # fmt: skip
    """One verdict per clip: its video verdict plus the first-frame constraint against uint8 [N, H, W, 3] `first_frames`."""
    check_clips(clips)
    n, _, height, width = clips.shape[:4]
    if not isinstance(first_frames, np.ndarray) or first_frames.dtype != np.uint8 or first_frames.shape != (n, height, width, 3):
        got = first_frames.shape if isinstance(first_frames, np.ndarray) else type(first_frames).__name__
        raise ValueError(f"first frames must be uint8 [{n}, {height}, {width}, 3] like the clips' frames, got {got}")
    verdicts = verify_clips(clips, captions, tolerance)
    seen = detect(np.concatenate([clips[:, 0], first_frames]), tolerance)
    out = []
    for i, verdict in enumerate(verdicts):
        failure = first_frame_failure(seen[i], seen[n + i], height, width)
        failures = verdict.failures + ((failure,) if failure else ())
        out.append(Verdict(verdict.met + (failure is None), verdict.total + 1, failures))
    return out


def world_first_frames(captions: Sequence[str], height: int, width: int, frames: int) -> np.ndarray:
    """uint8 [N, H, W, 3]: frame 0 of each caption's ground-truth clip at seed WORLD_SEED."""
    from cosmos_rl.shapes.clips import render_clip

    return np.stack([render_clip(caption, WORLD_SEED, (height, width), frames)[0] for caption in captions])


def score_i2v_clips(clips: np.ndarray, captions: Sequence[str], mode: str = "strict") -> list[float]:
    """The I2V reward of each clip against the world's first frame of its caption (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_clips(clips)
    frames = world_first_frames(captions, clips.shape[2], clips.shape[3], clips.shape[1])
    return [getattr(verdict, mode) for verdict in verify_i2v_clips(clips, captions, frames)]
