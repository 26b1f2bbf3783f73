"""A clip scored by an image reward: which frames are scored, what prompt each is scored against,
and how the frame scores make the clip's one score (`frame_reduce`, `frame_stride` of a reward table).

Pure: no I/O. The client (`cosmos_rl.rewards.client`) sends the chosen frames to the service as
ordinary images, so any image-only service scores clips without knowing about them.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Sequence

from cosmos_rl.core.schema import FrameReduce
from cosmos_rl.suites import registry as suites

FRAME_REDUCERS: tuple[str, ...] = typing.get_args(FrameReduce)
# (frame_reduce, frame_stride) of a reward table left alone: the schema's defaults.
DEFAULT_SETTINGS = ("mean", 1)
# Reducers that score one frame, so a stride plays no part.
ONE_FRAME = ("first", "last")

# What a caller may give as the per-frame prompts of N clips: one per clip (a list, None where a
# caption has no per-frame form), a function from the clip's prompt to it, or None for the clip's
# own prompt.
PerFramePrompts = typing.Union[None, Callable[[str], typing.Optional[str]], Sequence[typing.Optional[str]]]


def check_frame_settings(reduce: str, stride: int) -> None:
    """ValueError unless `reduce` is a known reducer and `stride` a positive integer it can use."""
    if reduce not in FRAME_REDUCERS:
        raise ValueError(f"frame_reduce must be one of {list(FRAME_REDUCERS)}, got {reduce!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"frame_stride must be an integer >= 1, got {stride!r}")
    if reduce in ONE_FRAME and stride != 1:
        raise ValueError(f"frame_stride {stride} plays no part with frame_reduce {reduce!r}, which scores one frame")


def scored_frames(num_frames: int, reduce: str, stride: int) -> list[int]:
    """The frame indices an image reward scores: frame 0 and every `stride`-th after it, or the one
    frame `first`/`last` names. 9 frames, stride 4 -> [0, 4, 8]; stride 3 -> [0, 3, 6]."""
    check_frame_settings(reduce, stride)
    if num_frames < 1:
        raise ValueError(f"a clip has at least one frame, got {num_frames}")
    if reduce == "first":
        return [0]
    if reduce == "last":
        return [num_frames - 1]
    return list(range(0, num_frames, stride))


def reduce_scores(frame_scores: Sequence[float], reduce: str) -> float:
    """One clip's score from its scored frames' scores (in frame order)."""
    if not frame_scores:
        raise ValueError("no frame scores to reduce")
    if reduce == "mean":
        return math.fsum(frame_scores) / len(frame_scores)
    if reduce == "min":
        return min(frame_scores)
    if reduce in ONE_FRAME:
        if len(frame_scores) != 1:
            raise ValueError(f"frame_reduce {reduce!r} reduces one frame score, got {len(frame_scores)}")
        return frame_scores[0]
    raise ValueError(f"frame_reduce must be one of {list(FRAME_REDUCERS)}, got {reduce!r}")


def frame_prompts(prompts: Sequence[str], per_frame: PerFramePrompts) -> list[typing.Optional[str]]:
    """Each clip's per-frame prompt: `per_frame` applied to `prompts` (None keeps each clip's own)."""
    if per_frame is None:
        out = list(prompts)
    elif callable(per_frame):
        out = [per_frame(p) for p in prompts]
    elif isinstance(per_frame, str):
        raise ValueError("per_frame_prompts must be one prompt per clip (a list) or a function, got a string")
    else:
        out = list(per_frame)
        if len(out) != len(prompts):
            raise ValueError(f"got {len(out)} per-frame prompts for {len(prompts)} clips")
    for i, text in enumerate(out):
        if text is not None and not isinstance(text, str):
            raise ValueError(f"per-frame prompt {i} must be a string or None, got {type(text).__name__}")
    return out


def frame_suite_of(reward: str):
    """The clip suite whose clips the image suite registering `reward` scores frame by frame (each
    frame against the clip caption's per-frame caption, the only form its parser reads: the shapes
    image verifier's rewards and the moving-shapes suite); None for any other reward."""
    owner = suites.reward_owner(reward)
    return suites.frame_by_frame(owner) if owner is not None and not owner.judges_clips else None


def reads_frame_captions(reward: str) -> bool:
    """Whether the built-in reward `reward` scores a clip's frames against per-frame captions
    (`builtin_frame_prompts`) rather than against the clip's own prompt."""
    return frame_suite_of(reward) is not None


def clip_twin(reward: str) -> str | None:
    """The whole-clip reward with the same score (strict or partial) as the image suite's `reward`:
    its clip suite's (`shapes_strict` -> `shapes_video_strict`); None for any other reward."""
    clip_suite = frame_suite_of(reward)
    if clip_suite is None:
        return None
    part = suites.reward_owner(reward).reward(reward).part
    return next((r.name for r in clip_suite.rewards if r.part == part and not r.given_frame), None)


def builtin_frame_prompts(reward: str, captions: Sequence[str]) -> list[typing.Optional[str]]:
    """What the built-in reward `reward` scores each clip's frames against: for an image suite's
    reward the per-frame caption its clip suite gives (the shapes verifier: the caption's static
    part, None for a colour change, which has none), since its parser reads image captions only;
    the caption itself for every other reward. The one rule behind `multi.frame_prompt_rule`, the
    online data check and `pairs mine`."""
    clip_suite = frame_suite_of(reward)
    if clip_suite is None:
        return list(captions)
    return list(clip_suite.resolve("frame_captions")(list(captions)))
