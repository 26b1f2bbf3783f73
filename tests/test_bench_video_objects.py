"""bench/video_objects.py's judging (what docs/studies/2026-12-05-what-the-base-cannot-draw.md is measured
with), on ground-truth clips changed by hand, so the diagnosis cannot rot between its runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from cosmos_rl.shapes.clips import render_clip

BENCH = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("bench_video_objects", BENCH / "video_objects.py")
video_objects = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(video_objects)

CAPTIONS = [
    "a red circle moving left",  # motion
    "a circle moving up and a square moving left",  # two_motions
    "a square turning from red to blue",  # colour_change: no static part, so no per-frame verdict
]


def _truth() -> np.ndarray:
    return np.stack([render_clip(caption, 0, 32, 9) for caption in CAPTIONS])


def test_ground_truth_is_right_in_every_frame_and_colour_changes_have_no_frame_verdict():
    out = video_objects.judge(_truth(), CAPTIONS)
    assert out["video_strict"] == {"motion": 1.0, "two_motions": 1.0, "colour_change": 1.0}
    assert out["frames_right"] == {"motion": 1.0, "two_motions": 1.0}
    assert out["clips_all_frames_right"] == {"motion": 1.0, "two_motions": 1.0}
    assert out["frames_right_by_index"] == [1.0] * 9


def test_one_object_blanked_in_one_frame_costs_that_frame_and_the_whole_clip():
    clips = _truth()
    two = clips[1]
    # Frame 4 of the two-object clip loses one object: its lit pixels past the middle of their
    # span, along the axis the two objects lie farther apart on, go black.
    frame = two[4].copy()
    ys, xs = np.nonzero(frame.max(axis=-1) > 0)
    axis = xs if np.ptp(xs) >= np.ptp(ys) else ys
    cut = (axis.min() + axis.max()) / 2
    drop = axis > cut
    frame[ys[drop], xs[drop]] = 0
    two[4] = frame
    out = video_objects.judge(clips, CAPTIONS)
    # The other clips are untouched; this one loses frame 4 by the image verifier (8 of 9 frames),
    # no longer has every frame right, and fails the video verifier's "present in every frame".
    assert out["frames_right"] == {"motion": 1.0, "two_motions": round(8 / 9, 4)}
    assert out["clips_all_frames_right"] == {"motion": 1.0, "two_motions": 0.0}
    assert out["frames_right_by_index"] == [1.0] * 4 + [0.5] + [1.0] * 4
    assert out["video_strict"]["two_motions"] == 0.0 and out["video_strict"]["motion"] == 1.0
