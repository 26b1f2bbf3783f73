"""The moving-shapes verifier: exact on ground truth, the right fraction on perturbed clips, robust to
mild noise and blur, and blind spots of a per-frame image reward shown."""

from dataclasses import replace

import numpy as np
import pytest

from cosmos_rl.shapes import CaptionError, verify
from cosmos_rl.shapes.analyse import Found
from cosmos_rl.shapes.clips import clip_layout, draw_clip, render_clip
from cosmos_rl.shapes.motion_caption import parse_motion_caption
from cosmos_rl.shapes.motion_spec import MOTION_TASKS
from cosmos_rl.shapes.motion_tracks import change_failure, direction_failure, link, still_failure, turn_failure
from cosmos_rl.shapes.motion_verifier import (
    frame_captions, judge_clip, motion_scores_by_task, score_clips, shapes_video_partial, shapes_video_strict,
    verify_clips,
)
from cosmos_rl.shapes.motion_world import all_motion_specs
from cosmos_rl.shapes.scene import Placed, draw

SHUFFLE = [4, 0, 8, 2, 6, 1, 7, 3, 5]  # moves the last frame to the middle and frame 5 to the end


def _at(*points, colour="red", shape="circle"):
    return [Found(colour, shape, float(x), float(y), 50) for x, y in points]


# ------------------------------------------------------------------------ pieces, by hand
def test_link_follows_each_object_by_class_and_nearest_centroid():
    """Frame 0: red circles at x 5 and 20; frame 1: at 7 and 22 (nearest: 5->7, 20->22) and a blue
    circle; frame 2: only the one at 24, which the track last at 22 picks up (2 px, not 17)."""
    frames = [_at((5, 5), (20, 5)), _at((22, 5), (7, 5)) + _at((15, 25), colour="blue"), _at((24, 5))]
    tracks = link(frames)
    assert [[None if p is None else p.x for p in t.path] for t in tracks] == [[5, 7, None], [20, 22, 24], [None, 15, None]]
    assert [t.describe() for t in tracks] == ["red circle in frames 0-1", "red circle in frames 0-2", "blue circle in frame 1"]
    # A track missing for a frame waits: frames 0 and 2 join into one track seen in frames 0,2.
    (gap,) = link([_at((5, 5)), [], _at((6, 5))])
    assert gap.seen == [0, 2] and gap.describe() == "red circle in frames 0,2"


def test_path_rules_at_32_px():
    """Travel needs 8 px (a quarter of 32); a step back may be 1.6 px, drift across 3.2 px; still
    allows 1.6 px; a colour change switches once, jumping at most 3.2 px."""
    def line(xs, ys=None):
        return _at(*zip(xs, ys if ys is not None else [16] * len(xs)))
    assert direction_failure(line([20, 17, 14, 11.5]), "left", 32, 32) is None  # 8.5 px left
    assert direction_failure(line([20, 18, 16, 12.5]), "left", 32, 32) == "travels 7.5 px left, needs 8.0"
    assert direction_failure(line([20, 15, 16.5, 11]), "left", 32, 32) is None  # 1.5 px back: within 1.6
    assert "steps 2.0 px back" in direction_failure(line([20, 13, 15, 11]), "left", 32, 32)
    assert "drifts 3.5 px across" in direction_failure(line([20, 16, 12], [16, 17, 19.5]), "left", 32, 32)
    assert direction_failure(line([16, 16, 16], [8, 12, 18]), "down", 32, 32) is None
    assert "fewer than 2 frames" in direction_failure(line([20]), "left", 32, 32)
    # left 9 px to frame 2, then 9 px up
    assert turn_failure(line([20, 15.5, 11, 11, 11], [20, 20, 20, 15.5, 11]), "left", "up", 32, 32) is None
    assert "at any split (it moves left all along)" in turn_failure(line([20, 15, 10, 5]), "left", "up", 32, 32)
    # The same turn without its corner frame: the first leg is 4.5 px short, or drifts 4.5 px up.
    assert turn_failure(line([20, 15.5, 11, 11], [20, 20, 15.5, 11]), "left", "up", 32, 32) is not None
    assert still_failure(line([10, 11, 11.5], [5, 5, 5]), 32, 32) is None
    assert still_failure(line([10, 12], [5, 5]), 32, 32) == "moves 2.0 px while staying still (at most 1.6)"
    red, blue = _at((10, 10)), _at((10, 11), colour="blue")
    assert change_failure(tuple(red * 2 + blue * 2), "red", "blue", 32, 32) is None
    assert change_failure(tuple(red + blue + red + blue), "red", "blue", 32, 32) == "switches colour 3 times, not once"
    assert "blue in the first frame" in change_failure(tuple(blue + red), "red", "blue", 32, 32)
    assert "jumps 5.0 px" in change_failure(tuple(red + _at((10, 15), colour="blue")), "red", "blue", 32, 32)


def test_judge_worked_examples():
    """The module docstring's examples, on hand-made tracks."""
    spec = parse_motion_caption("a red circle moving left")
    back = link([_at((10 + 2 * t, 16)) for t in range(5)])  # moves right
    v = judge_clip(spec, back, 32, 32)
    assert (v.met, v.total) == (1, 2) and v.failures == ("'a red circle moving left' travels -8.0 px left, needs 8.0",)
    extra = link([_at((20 - 2.5 * t, 16)) + (_at((5, 5), colour="blue", shape="square") if t == 2 else []) for t in range(5)])
    v = judge_clip(spec, extra, 32, 32)
    assert (v.met, v.total) == (2, 3) and v.failures == ("extra blue square in frame 2",)
    v = judge_clip(parse_motion_caption("two red circles moving up"), link([_at((8, 20), (24, 20))] * 4), 32, 32)
    assert (v.met, v.total) == (2, 4)
    reverse = link([_at((16, 16), colour="blue", shape="square")] * 2 + [_at((16, 16), shape="square")] * 2)
    v = judge_clip(parse_motion_caption("a square turning from red to blue"), reverse, 32, 32)
    assert (v.met, v.total) == (1, 2)
    v = judge_clip(spec, [], 32, 32)
    assert (v.met, v.total) == (0, 2) and v.failures == (
        "'a red circle moving left' is never seen", "'a red circle moving left' is not seen moving left")


# --------------------------------------------------------------- ground truth scores 1
@pytest.fixture(scope="module")
def truth():
    """Ground-truth clips: 16 prompts of each task (a fixed sample), two seeds each."""
    rng = np.random.default_rng(0)
    captions = []
    for task in MOTION_TASKS:
        specs = all_motion_specs(task)
        captions += [specs[i].caption() for i in rng.permutation(len(specs))[:16]]
    captions = [c for c in captions for _ in range(2)]
    clips = np.stack([render_clip(c, seed=i % 2) for i, c in enumerate(captions)])
    return clips, captions


def test_ground_truth_scores_one_on_every_task(truth):
    clips, captions = truth
    assert {parse_motion_caption(c).task for c in captions} == set(MOTION_TASKS)
    verdicts = verify_clips(clips, captions)
    assert [v.failures for v in verdicts if v.strict < 1] == []
    assert [v.partial for v in verdicts] == [1.0] * len(captions)
    assert score_clips(clips[:12], captions[:12], "strict") == shapes_video_partial(clips[:12], captions[:12]) == [1.0] * 12


def test_ground_truth_scores_one_at_other_sizes_and_frame_counts():
    captions = [all_motion_specs(task)[i].caption() for task in MOTION_TASKS for i in (3, 50)]
    for size, frames in ((32, 5), (32, 17), (64, 9), ((48, 64), 5)):
        clips = np.stack([render_clip(c, 7, size, frames) for c in captions])
        assert shapes_video_strict(clips, captions) == [1.0] * len(captions), (size, frames)


def _blur(clips: np.ndarray, sigma: float) -> np.ndarray:
    """The image verifier's tests' blur (5 taps, edges repeated), on every frame."""
    taps = np.exp(-0.5 * (np.arange(-2, 3) / sigma) ** 2)
    taps /= taps.sum()
    x = clips.astype(np.float64)
    h, w = x.shape[2:4]
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (0, 0), (0, 0)), mode="edge")
    x = sum(t * padded[:, :, i:i + h] for i, t in enumerate(taps))
    padded = np.pad(x, ((0, 0), (0, 0), (0, 0), (2, 2), (0, 0)), mode="edge")
    return sum(t * padded[:, :, :, i:i + w] for i, t in enumerate(taps))


def test_mild_noise_and_blur_change_nothing(truth):
    """+-8 uniform on every channel of every pixel (a lossy encoder's error, roughly), alone and on
    top of the image verifier's tests' blur (sigma 0.6 px)."""
    clips, captions = truth
    rng = np.random.default_rng(0)
    noise = rng.integers(-8, 9, clips.shape)
    noisy = np.clip(clips + noise, 0, 255).astype(np.uint8)[::2]  # every task, one seed
    both = np.clip(np.rint(_blur(clips, 0.6) + noise), 0, 255).astype(np.uint8)
    for batch, texts in ((noisy, captions[::2]), (both, captions)):
        assert [v.failures for v in verify_clips(batch, texts) if v.strict < 1] == []


# ------------------------------------------------------------------------- perturbations
def _reversed(clip):
    return clip[::-1]


def _frozen(clip):
    return np.repeat(clip[:1], len(clip), axis=0)


def _shuffled(clip):
    return clip[SHUFFLE]


def _blank(frame):
    def blank(clip):
        out = clip.copy()
        out[frame] = 0
        return out
    return blank


@pytest.mark.parametrize("caption, perturb, partial", [
    # One object moving: "present" holds, the motion fails, 1/2 -- backwards it travels the other
    # way, frozen it travels 0 px, shuffled it ends 1/8 of its travel from where it began.
    ("a red circle moving left", _reversed, 1 / 2),
    ("a red circle moving left", _frozen, 1 / 2),
    ("a red circle moving left", _shuffled, 1 / 2),
    ("a circle moving left then up", _reversed, 1 / 2),  # played backwards it moves down, then right
    ("a circle moving left then up", _shuffled, 1 / 2),
    # Two objects: both present, both motions fail (2/4); the still one keeps its "still" (3/4).
    ("a circle moving up and a square moving left", _reversed, 2 / 4),
    ("a circle moving up and a square moving left", _shuffled, 2 / 4),
    ("a red circle staying still and a blue square moving down", _reversed, 3 / 4),
    ("a red circle staying still and a blue square moving down", _frozen, 3 / 4),
    ("three green squares moving right", _reversed, 3 / 6),
    ("two circles moving down", _frozen, 2 / 4),
    # A colour change backwards is blue first; frozen it never switches; shuffled it starts blue.
    ("a square turning from red to blue", _reversed, 1 / 2),
    ("a square turning from red to blue", _frozen, 1 / 2),
    ("a square turning from red to blue", _shuffled, 1 / 2),
    # Time does not show in a still clip: played backwards, frozen or shuffled it is the same clip.
    ("a blue triangle staying still", _reversed, 1.0),
    ("a blue triangle staying still", _shuffled, 1.0),
    # Frame 6 black: every object misses a frame, every motion still holds on the frames seen.
    ("a red circle moving left", _blank(6), 1 / 2),
    ("a circle moving left then up", _blank(6), 1 / 2),
    ("a circle moving up and a square moving left", _blank(6), 2 / 4),
    ("three green squares moving right", _blank(6), 3 / 6),
    ("a square turning from red to blue", _blank(6), 1 / 2),
    ("a blue triangle staying still", _blank(6), 1 / 2),
])
def test_perturbed_clips_score_the_hand_worked_fraction(caption, perturb, partial):
    clips = np.stack([perturb(render_clip(caption, seed)) for seed in range(6)])
    verdicts = verify_clips(clips, [caption] * len(clips))
    assert [v.partial for v in verdicts] == pytest.approx([partial] * len(clips))
    assert [v.strict for v in verdicts] == [float(partial == 1.0)] * len(clips)


def _free_spot(placed, h=4.8, size=32):
    """A box centre where a new object of half-size h touches nothing (grid scan, deterministic)."""
    for cy in np.arange(h + 1, size - h - 1, 0.5):
        for cx in np.arange(h + 1, size - h - 1, 0.5):
            if all(abs(cx - o.cx) >= o.h + h + 2 or abs(cy - o.cy) >= o.h + h + 2 for o in placed):
                return float(cx), float(cy)
    return None


@pytest.mark.parametrize("caption, shape, colour, partial", [
    ("a red circle moving left", "square", "blue", 2 / 3),  # 2 met, 1 extra track
    ("two red circles moving up", "circle", "red", 4 / 5),  # same class: a third, one-frame track
    ("a circle moving up and a square moving left", "triangle", "magenta", 4 / 5),
    ("a square turning from red to blue", "triangle", "green", 2 / 3),
    ("a green circle staying still", "circle", "green", 2 / 3),
])
def test_an_extra_object_in_one_frame_is_one_failure(caption, shape, colour, partial):
    clips = []
    for seed in range(8):
        movers = clip_layout(parse_motion_caption(caption), seed)
        placed = [m.at(4) for m in movers]
        spot = _free_spot(placed)
        if spot is None:
            continue  # no room for a fourth object in frame 4 at this seed
        clip = draw_clip(movers)
        clip[4] = draw(placed + [Placed(shape, colour, *spot, 4.8)])
        clips.append(clip)
    assert len(clips) >= 5
    verdicts = verify_clips(np.stack(clips), [caption] * len(clips))
    assert [v.partial for v in verdicts] == pytest.approx([partial] * len(clips))
    assert all(v.failures[-1] == f"extra {colour} {shape} in frame 4" for v in verdicts)


def _edit(caption, seed, frame, change):
    """The clip of ``caption`` with frame ``frame`` redrawn from ``change(list of placed objects)``."""
    movers = clip_layout(parse_motion_caption(caption), seed)
    clip = draw_clip(movers)
    clip[frame] = draw(change([m.at(frame) for m in movers]))
    return clip


@pytest.mark.parametrize("caption, change, partial", [
    # The square drops out of frame 6: it is not present, it still moves; the circle is fine: 3/4.
    ("a circle moving up and a square moving left", lambda placed: placed[:1], 3 / 4),
    # The circle turns blue for one frame: the red track misses it (1 of 2 met) and the blue
    # circle of that frame is an extra: 1 / 3.
    ("a red circle moving left", lambda placed: [replace(placed[0], colour="blue")], 1 / 3),
])
def test_one_frame_flickers(caption, change, partial):
    clips = np.stack([_edit(caption, seed, 6, change) for seed in range(6)])
    assert [v.partial for v in verify_clips(clips, [caption] * len(clips))] == pytest.approx([partial] * len(clips))


def test_objects_are_told_apart_by_colour():
    """The red circle goes up and the blue one left; captioned the other way round both are present
    and neither moves as asked: 2/4."""
    clips = np.stack([render_clip("a red circle moving up and a blue circle moving left", seed) for seed in range(6)])
    swapped = ["a blue circle moving up and a red circle moving left"] * len(clips)
    assert shapes_video_partial(clips, swapped) == pytest.approx([2 / 4] * len(clips))


# ---------------------------------------------------------------- what an image reward sees
def test_a_per_frame_image_reward_cannot_see_time():
    """Every frame of a shuffled motion clip still shows exactly its per-frame caption ("a red
    circle"): the image verifier scores each frame 1.0 before and after, the video verifier 1.0
    before and 0.0 (strict) after."""
    captions = [spec.caption() for task in ("motion", "two_motions", "counting_motion", "turn")
                for spec in all_motion_specs(task)[:40:8]]
    clips = np.stack([render_clip(c, seed=3) for c in captions])
    shuffled = np.ascontiguousarray(clips[:, SHUFFLE])
    per_frame = [c for c in frame_captions(captions) for _ in range(clips.shape[1])]
    for batch in (clips, shuffled):
        frames = batch.reshape(-1, *batch.shape[2:])
        assert [v.strict for v in verify(frames, per_frame)] == [1.0] * len(per_frame)
    assert shapes_video_strict(clips, captions) == [1.0] * len(captions)
    assert shapes_video_strict(shuffled, captions) == [0.0] * len(captions)
    assert frame_captions(["a square turning from red to blue", "two red circles moving up"]) == [None, "two red circles"]


# ------------------------------------------------------------------- entry points, errors
def test_bad_input_is_refused_before_any_work():
    clips = np.zeros((2, 9, 32, 32, 3), np.uint8)
    with pytest.raises(CaptionError, match="'a red circle'"):
        score_clips(clips, ["a circle moving left", "a red circle"])
    with pytest.raises(ValueError, match="2 clips but 1 captions"):
        score_clips(clips, ["a circle moving left"])
    with pytest.raises(ValueError, match="mode must be one of"):
        score_clips(clips, ["a circle moving left"] * 2, mode="mean")
    with pytest.raises(ValueError, match="uint8"):
        score_clips(clips.astype(np.float32), ["a circle moving left"] * 2)
    with pytest.raises(ValueError, match=r"\[N, F, H, W, 3\]"):
        score_clips(clips[0], ["a circle moving left"] * 9)
    with pytest.raises(ValueError, match="at least 2 frames"):
        score_clips(clips[:, :1], ["a circle moving left"] * 2)
    with pytest.raises(ValueError, match="at least 32 px"):
        score_clips(np.zeros((1, 9, 16, 16, 3), np.uint8), ["a circle moving left"])
    assert score_clips(clips, ["a circle moving left", "a circle staying still"], "partial") == [0.0, 0.0]


def test_scores_by_task():
    captions = ["a circle moving left", "a square moving up", "a circle staying still"]
    assert motion_scores_by_task(captions, [1, 0, 1]) == {"motion": 0.5, "static": 1.0}
    with pytest.raises(ValueError, match="3 captions but 1 scores"):
        motion_scores_by_task(captions, [1])
