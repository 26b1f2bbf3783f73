"""Which reward may rank what a mining target samples, and the scores it gives. Torch-free.

What a reward may rank is asked of the suite that registers it (`cosmos_rl.suites`): its media
says whether it scores images or whole clips. An image target's samples are scored by any built-in
weight-free image reward or a reward of a suite of images. A clip target's (`model.num_frames`
above 1) are scored by a text-to-video reward of a suite of clips (`shapes_video_strict`,
`shapes_video_partial`), which sees time, or by an image reward frame by frame with a
`--frame-reduce` reducer (`rewards.frames`: every frame scored, the scores reduced to one by mean,
min, first or last). Frame by frame, an image suite's rewards judge each frame against the
per-frame caption of the clip suite they score (`rewards.frames.builtin_frame_prompts`: the shapes
verifier's, the caption's static part: "a red circle moving left" -> "a red circle"), both of their
scores reduced alike; a colour change has no static part, so its rows cannot be scored that way
(`unscorable_rows`); any other image reward scores each frame against the clip's own prompt.

Everything else is a user mistake refused before the target loads: a clip reward for images, an
image reward for clips without a reducer, a reducer for images or beside a clip reward, or a
reward that judges a given first frame (mining samples text to video).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from cosmos_rl.config.preflight.rewards import image_twin
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.evaluation.scores import reward_names
from cosmos_rl.rewards.frames import FRAME_REDUCERS, builtin_frame_prompts, reads_frame_captions
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import Suite


def clip_rewards() -> list[str]:
    """The built-in text-to-video clip rewards: those of the prompt suites of clips, none judging a
    given frame (an episode suite's rewards judge a window key's clips: no caption's)."""
    return [r.name for suite in suites.builtin_suites() if suite.judges_clips and not suite.is_episodic
            for r in suite.rewards if not r.given_frame]  # fmt: skip


def reward_suite(reward: str) -> Suite | None:
    """The suite that registers `reward` (None for a weight-free one); a UserError for an outside
    suite's reward that cannot be resolved."""
    try:
        return suites.reward_owner(reward)
    except suites.UnknownSuite as exc:
        raise UserError(f"--reward {reward!r}: {exc}") from None


def check_reward(reward: str, media: MediaSpec, frame_reduce: Optional[str], target: str) -> None:
    """UserError unless `reward` (with `frame_reduce`) can rank `target`'s samples of `media`."""
    frames = media.frames
    from cosmos_rl.commands.evaluate import check_sampling_options

    if frame_reduce is not None and frame_reduce not in FRAME_REDUCERS:
        raise UserError(f"--frame-reduce: {frame_reduce!r} is not a reducer; use one of {', '.join(FRAME_REDUCERS)}")
    suite = reward_suite(reward)
    if frames == 1:
        if suite is not None and suite.judges_clips:
            raise UserError(f"--reward {reward}: scores whole clips, and {target} makes images (1 frame); use "
                            f"{image_twin(reward) or 'an image reward'} for images, or --frames {suite.media.frames} for a bare model")  # fmt: skip
        if frame_reduce is not None:
            raise UserError(f"--frame-reduce {frame_reduce}: {target} makes images (1 frame), so no clip is scored "
                            "frame by frame; drop --frame-reduce")  # fmt: skip
        check_sampling_options(reward, 1, suite or suites.for_media(clips=False))
        return
    clip = f"{target} makes {frames}-frame clips"
    clips = clip_rewards()
    if suite is not None and suite.is_episodic:
        # run_mine sends an episode suite's reward to mining.world first; a caller reaching here mines captions.
        raise UserError(f"--reward {reward}: judges a world model's clips against the {suite.title} window each prompt's key names, "
                        f"and these samples are of captions; mine it alone on a file of window keys, or use {' or '.join(clips)}")  # fmt: skip
    if suite is not None and suite.reward(reward).given_frame:
        part = suite.reward(reward).part
        plain = next((r.name for r in suite.rewards if r.part == part and not r.given_frame), None)
        raise UserError(f"--reward {reward}: judges image-to-video clips, and pairs mine samples text to video; "
                        f"use {plain or ' or '.join(clips)}")  # fmt: skip
    if suite is not None and suite.judges_clips:
        if frame_reduce is not None:
            raise UserError(f"--frame-reduce {frame_reduce}: plays no part: {reward} scores whole clips itself; drop --frame-reduce")
        return
    images = reward_names(suite or suites.for_media(clips=False))
    if reward not in images:
        raise UserError(f"--reward: {reward!r} is not a built-in reward; {clip}: use {' or '.join(clips)}, or an "
                        f"image reward ({', '.join(images)}) with --frame-reduce")  # fmt: skip
    if frame_reduce is None:
        raise UserError(f"--reward {reward}: scores images, and {clip}; pass --frame-reduce "
                        f"({', '.join(FRAME_REDUCERS)}) to score each clip frame by frame, or use "
                        f"{' or '.join(clips)}")  # fmt: skip


def ranks_by(reward: str) -> str:
    """Which number ranks the samples: "partial" for a suite's partial reward (partial credit), else "score"."""
    suite = reward_suite(reward)
    return "partial" if suite is not None and suite.reward(reward).part == "partial" else "score"


def scoring_suite(reward: str, frames: int) -> Suite:
    """The suite whose tasks count the samples: the reward's; for an image suite's reward on clips
    the clip suite whose clips it scores frame by frame; for a weight-free reward the built-in image
    suite, whose tasks (or `other`) its rows counted under before suites had names, clips included."""
    suite = reward_suite(reward)
    if suite is None:
        return suites.for_media(clips=False)
    if frames > 1 and not suite.judges_clips:
        return suites.frame_by_frame(suite) or suite
    return suite


def score_samples(
    reward: str, samples: np.ndarray, captions: Sequence[str], frame_reduce: Optional[str] = None
) -> tuple[list[float], Optional[list[float]]]:
    """(score, partial or None) per uint8 sample: an image [N, H, W, 3] or a clip [N, F, H, W, 3]
    (with a clip reward, or an image reward reduced over the frames by `frame_reduce`). Frame by
    frame a reward of the shapes verifier needs every caption's static part (rows `unscorable_rows`
    names are dropped first)."""
    from cosmos_rl.evaluation.scores import score_images

    suite = reward_suite(reward) or suites.for_media(clips=False)  # a suite's reward: its own verifier

    if samples.ndim == 5 and frame_reduce is not None:
        from cosmos_rl.rewards.frames import reduce_scores, scored_frames

        picked = scored_frames(samples.shape[1], frame_reduce, 1)
        per = len(picked)
        flat = samples[:, picked].reshape(-1, *samples.shape[2:])
        scores, partials = score_images(reward, flat, [c for c in builtin_frame_prompts(reward, captions) for _ in range(per)], suite)

        def reduced(values):
            return [float(reduce_scores(values[i * per : (i + 1) * per], frame_reduce)) for i in range(len(captions))]

        return reduced(scores), (reduced(partials) if partials is not None else None)
    scores, partials = score_images(reward, samples, captions, suite)
    return [float(s) for s in scores], ([float(p) for p in partials] if partials is not None else None)


def unscorable_rows(reward: str, media: MediaSpec, frame_reduce: Optional[str], captions: Sequence[str]) -> list[int]:
    """The rows an image verifier reward cannot score frame by frame: colour changes, whose captions
    have no static part (`builtin_frame_prompts` gives None). Empty for any other reward or media."""
    if not media.is_video or frame_reduce is None or not reads_frame_captions(reward):
        return []
    return [row for row, text in enumerate(builtin_frame_prompts(reward, captions)) if text is None]
