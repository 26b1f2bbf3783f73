"""The two built-in suites over the shapes world (`cosmos_rl.shapes`): `shapes` (32x32 images, the
image verifier) and `shapes_video` (9-frame 32x32 clips, the moving-shapes verifier, with the
world's first frame of each caption as its conditioning source).

The `Suite` values name their code by import strings, so reading them (`validate`) imports no
world; the functions here adapt the world's public API (`cosmos_rl.shapes`) to what a suite
answers, each importing the world on its first call for the same reason.

Both suites keep what evaluation did before it named suites: held-out prompts of the split at seed
0 spread over each task, the verifier's strict and partial scores, the same reward functions under
the same names, and overlap checks through either grammar (a training prompt of one world is
compared with held-out prompts in the spelling of whichever grammar reads it first).
"""

from __future__ import annotations

from collections.abc import Sequence

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites.base import Suite, SuiteReward, spread

SPLIT_SEED = 0  # the held-out split `python -m cosmos_rl.shapes prompts DIR` (and video-prompts) writes by default
MODES = ("strict", "partial")


# ---------------------------------------------------------------------------------- images
def held_out_images(per_task: int) -> list[tuple[str, str]]:
    # The world imports numpy and more: imported when asked, never by reading the suite (validate).
    from cosmos_rl.shapes import TASKS, split_prompts

    split = split_prompts(SPLIT_SEED)
    return [(spec.caption(), task) for task in TASKS for spec in spread(split.held_out[task], per_task)]


def verify_images(images, captions: Sequence[str]) -> tuple[list[float], list[float]]:
    from cosmos_rl.shapes import verify

    verdicts = verify(images, captions)
    return [v.strict for v in verdicts], [v.partial for v in verdicts]


def score_images(images, prompts: Sequence[str], mode: str = "strict") -> list[float]:
    """The image rewards: `shapes_strict` and `shapes_partial` of the world, by `mode`."""
    from cosmos_rl.shapes import shapes_partial, shapes_strict

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return (shapes_strict if mode == "strict" else shapes_partial)(images, prompts)


def canonical(caption: str) -> str:
    """The canonical spelling of an image or a video caption (image grammar first), else the caption
    lowercased with its spaces joined."""
    from cosmos_rl.shapes import CaptionError, parse_caption, parse_motion_caption

    for parse in (parse_caption, parse_motion_caption):
        try:
            return parse(caption).canonical().caption()
        except CaptionError:
            continue
    return " ".join(caption.lower().split())


# ----------------------------------------------------------------------------------- clips
def held_out_clips(per_task: int) -> list[tuple[str, str]]:
    from cosmos_rl.shapes import MOTION_TASKS, split_motion_prompts

    split = split_motion_prompts(SPLIT_SEED)
    return [(spec.caption(), task) for task in MOTION_TASKS for spec in spread(split.held_out[task], per_task)]


def motion_task_of(caption: str) -> str:
    from cosmos_rl.shapes import parse_motion_caption

    return parse_motion_caption(caption).task


def verify_clips(clips, captions: Sequence[str]) -> tuple[list[float], list[float]]:
    from cosmos_rl.shapes import verify_clips as verdicts_of

    verdicts = verdicts_of(clips, captions)
    return [v.strict for v in verdicts], [v.partial for v in verdicts]


def world_first_frames(captions: Sequence[str], media: MediaSpec, seeds: Sequence[int] | None):
    """Frame 0 of each caption's ground-truth clip: at the world's seed (the frame the I2V rewards
    judge frame 0 against: one function draws both) or at each caption's seed."""
    import numpy as np

    if seeds is None:
        from cosmos_rl.shapes.first_frame_check import world_first_frames as at_world_seed

        return at_world_seed(captions, media.height, media.width, media.frames)
    from cosmos_rl.shapes import render_clip

    return np.stack([render_clip(caption, seed, media.size, media.frames)[0] for caption, seed in zip(captions, seeds)])


# ---------------------------------------------------------------------------------- suites
SHAPES = Suite(
    name="shapes", title="shapes", media=MediaSpec.image(32), preset="shapes",
    rewards=(
        SuiteReward(name="shapes_strict", scorer="cosmos_rl.suites.shapes:score_images", part="strict"),  # all constraints met (GenEval's rule)
        SuiteReward(name="shapes_partial", scorer="cosmos_rl.suites.shapes:score_images", part="partial"),  # the fraction met, extras failing
    ),
    tasks_of="cosmos_rl.shapes:TASKS", held_out_prompts="cosmos_rl.suites.shapes:held_out_images",
    held_out_title=f"shapes held-out prompts (split seed {SPLIT_SEED})",
    caption_task="cosmos_rl.shapes:task_of", verifier="cosmos_rl.suites.shapes:verify_images",
    prompt_source="python -m cosmos_rl.shapes prompts DIR", canonical_caption="cosmos_rl.suites.shapes:canonical",
)  # fmt: skip

SHAPES_VIDEO = Suite(
    name="shapes_video", title="moving-shapes", media=MediaSpec(frames=9, height=32, width=32), preset="shapes_video",
    rewards=(
        SuiteReward(name="shapes_video_strict", scorer="cosmos_rl.shapes:score_clips", part="strict"),  # every clause met over the clip
        SuiteReward(name="shapes_video_partial", scorer="cosmos_rl.shapes:score_clips", part="partial"),  # the fraction met
        # I2V (rl.first_frame = "shapes_world"): also frame 0 keeps the objects of the world's first frame
        SuiteReward(name="shapes_video_i2v_strict", scorer="cosmos_rl.shapes.first_frame_check:score_i2v_clips", part="strict", given_frame=True),
        SuiteReward(name="shapes_video_i2v_partial", scorer="cosmos_rl.shapes.first_frame_check:score_i2v_clips", part="partial", given_frame=True),
    ),
    tasks_of="cosmos_rl.shapes:MOTION_TASKS", held_out_prompts="cosmos_rl.suites.shapes:held_out_clips",
    held_out_title=f"moving-shapes held-out prompts (split seed {SPLIT_SEED})",
    caption_task="cosmos_rl.suites.shapes:motion_task_of", verifier="cosmos_rl.suites.shapes:verify_clips",
    prompt_source="python -m cosmos_rl.shapes video-prompts DIR", canonical_caption="cosmos_rl.suites.shapes:canonical",
    first_frames="cosmos_rl.suites.shapes:world_first_frames",
    # The image verifier scores a clip's frames against each caption's static part ("a red circle
    # moving left" -> "a red circle"), the only form its parser reads; a colour change has none.
    frame_suite="shapes", frame_captions="cosmos_rl.shapes:frame_captions",
)  # fmt: skip
