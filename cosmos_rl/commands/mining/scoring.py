"""Which reward may rank what a mining target samples, and the scores it gives. Torch-free.

An image target's samples are scored by any built-in weight-free image reward. A clip target's
(`model.num_frames` above 1) are scored by a text-to-video clip reward of the moving-shapes
verifier (`shapes_video_strict`, `shapes_video_partial`), which sees time, or by an image reward
frame by frame with a `--frame-reduce` reducer (`rewards.frames`: every frame scored, the scores
reduced to one by mean, min, first or last). Frame by frame, the image verifier's rewards
(`shapes_strict`, `shapes_partial`) judge each frame against the caption's static part
(`shapes.motion_verifier.frame_captions`: "a red circle moving left" -> "a red circle"), both of
their scores reduced alike; a colour change has no static part, so its rows cannot be scored that
way (`unscorable_rows`); any other image reward scores each frame against the clip's own prompt.

Everything else is a user mistake refused before the target loads: a clip reward for images, an
image reward for clips without a reducer, a reducer for images or beside a clip reward, or an
image-to-video reward (mining samples text to video).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from cosmos_rl.config.preflight.rewards import I2V_REWARDS, VIDEO_REWARDS
from cosmos_rl.rewards.frames import CAPTION_GRAMMAR_REWARDS, builtin_frame_prompts
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec

CLIP_REWARDS = tuple(name for name in VIDEO_REWARDS if name not in I2V_REWARDS)  # text to video, whole clips


def check_reward(reward: str, media: MediaSpec, frame_reduce: Optional[str], target: str) -> None:
    """UserError unless `reward` (with `frame_reduce`) can rank `target`'s samples of `media`."""
    from cosmos_rl.commands.evaluate import check_sampling_options
    from cosmos_rl.evaluation.scores import reward_names
    from cosmos_rl.rewards.frames import FRAME_REDUCERS

    if frame_reduce is not None and frame_reduce not in FRAME_REDUCERS:
        raise UserError(f"--frame-reduce: {frame_reduce!r} is not a reducer; use one of {', '.join(FRAME_REDUCERS)}")
    if not media.is_video:
        if reward in VIDEO_REWARDS:
            raise UserError(f"--reward {reward}: scores whole clips, and {target} makes images (1 frame); use "
                            f"{reward.replace('_video', '').replace('_i2v', '')} for images, or --frames 9 for a bare model")  # fmt: skip
        if frame_reduce is not None:
            raise UserError(f"--frame-reduce {frame_reduce}: {target} makes images (1 frame), so no clip is scored "
                            "frame by frame; drop --frame-reduce")  # fmt: skip
        check_sampling_options(reward, 1)
        return
    clip = f"{target} makes {media.frames}-frame clips"
    if reward in I2V_REWARDS:
        raise UserError(f"--reward {reward}: judges image-to-video clips, and pairs mine samples text to video; "
                        f"use {reward.replace('_i2v', '')}")  # fmt: skip
    if reward in CLIP_REWARDS:
        if frame_reduce is not None:
            raise UserError(f"--frame-reduce {frame_reduce}: plays no part: {reward} scores whole clips itself; drop --frame-reduce")
        return
    if reward not in reward_names():
        raise UserError(f"--reward: {reward!r} is not a built-in reward; {clip}: use {' or '.join(CLIP_REWARDS)}, or an "
                        f"image reward ({', '.join(reward_names())}) with --frame-reduce")  # fmt: skip
    if frame_reduce is None:
        raise UserError(f"--reward {reward}: scores images, and {clip}; pass --frame-reduce "
                        f"({', '.join(FRAME_REDUCERS)}) to score each clip frame by frame, or use "
                        f"{' or '.join(CLIP_REWARDS)}")  # fmt: skip


def score_samples(
    reward: str, samples: np.ndarray, captions: Sequence[str], frame_reduce: Optional[str] = None
) -> tuple[list[float], Optional[list[float]]]:
    """(score, partial or None) per uint8 sample: an image [N, H, W, 3] or a clip [N, F, H, W, 3]
    (with a clip reward, or an image reward reduced over the frames by `frame_reduce`). Frame by
    frame a shapes reward needs every caption's static part (rows `unscorable_rows` names are
    dropped first)."""
    from cosmos_rl.evaluation.scores import score_images

    if samples.ndim == 5 and frame_reduce is not None:
        from cosmos_rl.rewards.frames import reduce_scores, scored_frames

        picked = scored_frames(samples.shape[1], frame_reduce, 1)
        per = len(picked)
        flat = samples[:, picked].reshape(-1, *samples.shape[2:])
        scores, partials = score_images(reward, flat, [c for c in builtin_frame_prompts(reward, captions) for _ in range(per)])

        def reduced(values):
            return [float(reduce_scores(values[i * per : (i + 1) * per], frame_reduce)) for i in range(len(captions))]

        return reduced(scores), (reduced(partials) if partials is not None else None)
    scores, partials = score_images(reward, samples, captions)
    return [float(s) for s in scores], ([float(p) for p in partials] if partials is not None else None)


def unscorable_rows(reward: str, media: MediaSpec, frame_reduce: Optional[str], captions: Sequence[str]) -> list[int]:
    """The rows an image verifier reward cannot score frame by frame: colour changes, whose captions
    have no static part (`builtin_frame_prompts` gives None). Empty for any other reward or media."""
    if not media.is_video or frame_reduce is None or reward not in CAPTION_GRAMMAR_REWARDS:
        return []
    return [row for row, text in enumerate(builtin_frame_prompts(reward, captions)) if text is None]
