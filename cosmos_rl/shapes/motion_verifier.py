"""The moving-shapes verifier: does a clip show exactly what its video caption asks for, over time?

Objects are found in every frame by the image world's rules and followed across frames as tracks
(:mod:`cosmos_rl.shapes.motion_tracks`). Each requested object (a clause's group of n gives n)
brings two constraints, and every track no requested object claims (an *extra*) one failed one:

- **present**: its track is seen in every frame (a flicker or a dropped frame fails it);
- **action**: its track's path follows the clause: the direction rule, the turn rule, staying
  still, or the colour-change rule (:mod:`cosmos_rl.shapes.motion_tracks` states each with its
  tolerances). Judged on the frames the track is seen in, so an object that flickers but moves
  right loses only "present";
- a requested object claims a track of its shape and of its colour when the clause names one
  (either colour of a colour change, or two tracks, one of each colour, seen in different
  frames: the object before and after its switch). Counts are constant when each of the n
  objects is present in every frame and no track is extra.

``partial`` = met / (2 x requested + extras); ``strict`` = 1 when nothing failed. Of all ways of
claiming tracks, the verdict takes the one with the fewest failures (the first found on a tie).

Worked examples (each extra track or unmet constraint is one failure):

- "a red circle moving left", the clip played backwards: present, does not move left -> 1/2;
- the same with one frame black: not present, still moves left -> 1/2; with a blue square in
  one frame only: present, moves left, one extra -> 2/3;
- "two red circles moving up" frozen on its first frame: 2 present, 0 move -> 2/4;
- "a square turning from red to blue" played backwards: the red and the blue track join into
  one present object that is blue first -> 1/2.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from cosmos_rl.shapes.analyse import COLOUR_TOLERANCE, check_pixels, check_side, detect
from cosmos_rl.shapes.motion_caption import motion_task_of, parse_motion_caption
from cosmos_rl.shapes.motion_spec import MOTION_TASKS, Clause, MotionSpec
from cosmos_rl.shapes.motion_tracks import (
    Path, Track, change_failure, direction_failure, link, merge, still_failure, turn_failure,
)
from cosmos_rl.shapes.tasks import mean_by_task
from cosmos_rl.shapes.verifier import Verdict, parse_all

MODES = ("strict", "partial")


@dataclass(frozen=True)
class _Candidate:
    """A way for one requested object to claim tracks: which tracks, and what then fails."""

    tracks: frozenset[int]
    failures: tuple[str, ...]

    @property
    def value(self) -> int:
        # Met constraints plus extras avoided: the verdict's failures fall by exactly this much.
        return 2 - len(self.failures) + len(self.tracks)


def _fits(clause: Clause, track: Track) -> bool:
    obj = track.first
    if obj.shape != clause.group.shape:
        return False
    if clause.action == "change":
        return obj.colour in clause.args
    return clause.group.colour is None or obj.colour == clause.group.colour


def _judge_path(clause: Clause, path: Path, height: int, width: int) -> tuple[str, ...]:
    name = repr(clause.phrase())
    failures = []
    missing = [t for t, obj in enumerate(path) if obj is None]
    if missing:
        failures.append(f"{name} is missing in frame{'s' if len(missing) > 1 else ''} {','.join(map(str, missing))}")
    points = [obj for obj in path if obj is not None]
    if clause.action == "move":
        problem = direction_failure(points, clause.args[0], height, width)
    elif clause.action == "turn":
        problem = turn_failure(points, *clause.args, height, width)
    elif clause.action == "still":
        problem = still_failure(points, height, width)
    else:
        problem = change_failure(path, *clause.args, height, width)
    if problem is not None:
        failures.append(f"{name} {problem}")
    return tuple(failures)


def _candidates(clause: Clause, tracks: list[Track], height: int, width: int, keep: int) -> list[_Candidate]:
    """The ``keep`` best ways for one object of ``clause`` to claim tracks, best first.

    ``keep`` = the number of requested objects is enough: the others claim at most keep - 1 of
    them, and swapping an object onto an unclaimed better candidate never adds failures.
    """
    fitting = [i for i, track in enumerate(tracks) if _fits(clause, track)]
    found = [_Candidate(frozenset({i}), _judge_path(clause, tracks[i].path, height, width)) for i in fitting]
    if clause.action == "change":
        first, last = clause.args
        for i, j in itertools.permutations(fitting, 2):
            if tracks[i].first.colour == first and tracks[j].first.colour == last:
                path = merge(tracks[i], tracks[j])
                if path is not None:
                    found.append(_Candidate(frozenset({i, j}), _judge_path(clause, path, height, width)))
    found.sort(key=lambda c: -c.value)  # stable: ties keep track order
    return found[:keep]


def judge_clip(spec: MotionSpec, tracks: list[Track], height: int, width: int) -> Verdict:
    """The verdict for one clip's tracks under ``spec`` (see the module docstring)."""
    requests = [clause for clause in spec.clauses for _ in range(clause.group.count)]
    options = [_candidates(c, tracks, height, width, len(requests)) + [None] for c in requests]
    best, best_value = None, None
    for choice in itertools.product(*options):
        claimed = [c.tracks for c in choice if c is not None]
        if sum(len(t) for t in claimed) != len(frozenset().union(*claimed)):
            continue  # two objects claim one track
        value = sum(c.value for c in choice if c is not None)
        if best_value is None or value > best_value:
            best, best_value = choice, value
    failures: list[str] = []
    claimed: set[int] = set()
    for clause, choice in zip(requests, best):
        if choice is None:
            failures += [f"{clause.phrase()!r} is never seen", f"{clause.phrase()!r} is not seen {clause.words()}"]
        else:
            failures += choice.failures
            claimed |= choice.tracks
    extras = [track for i, track in enumerate(tracks) if i not in claimed]
    failures += [f"extra {track.describe()}" for track in extras]
    total = 2 * len(requests) + len(extras)
    return Verdict(total - len(failures), total, tuple(failures))


def check_clips(clips: np.ndarray) -> None:
    """ValueError unless ``clips`` is uint8 [N, F, H, W, 3] with F >= 2 and both sides >= MIN_SIDE."""
    check_pixels(clips, "clips", "N, F, H, W, 3")
    if clips.shape[1] < 2:
        raise ValueError(f"shapes clips need at least 2 frames, got {clips.shape[1]}")
    check_side(clips, "clips")


def verify_clips(clips: np.ndarray, captions: Sequence[str], tolerance: float = COLOUR_TOLERANCE) -> list[Verdict]:
    """One verdict per uint8 [N, F, H, W, 3] clip and its video caption (every caption parsed
    first: :func:`cosmos_rl.shapes.verifier.parse_all`)."""
    check_clips(clips)
    specs = parse_all(captions, clips.shape[0], "clips", parse_motion_caption)
    n, frames, height, width = clips.shape[:4]
    found = detect(clips.reshape(n * frames, height, width, 3), tolerance)
    return [judge_clip(spec, link(found[i * frames:(i + 1) * frames]), height, width) for i, spec in enumerate(specs)]


def score_clips(clips: np.ndarray, captions: Sequence[str], mode: str = "strict") -> list[float]:
    """The reward of each clip: ``strict`` (1.0 when everything holds, else 0.0) or ``partial``
    (the fraction of constraints met, extra tracks counting as failed ones)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return [getattr(verdict, mode) for verdict in verify_clips(clips, captions)]


def shapes_video_strict(clips: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """1.0 when the clip shows exactly what its video caption asks for, at every frame, else 0.0."""
    return score_clips(clips, prompts, "strict")


def shapes_video_partial(clips: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """The fraction of the video caption's constraints met, extra tracks counting as failed ones."""
    return score_clips(clips, prompts, "partial")


def frame_captions(captions: Sequence[str]) -> list[Optional[str]]:
    """Each video caption's per-frame image caption ("a red circle moving left" -> "a red circle"),
    None for a colour change: what an image reward scores each frame against."""
    return [parse_motion_caption(caption).frame_caption() for caption in captions]


def motion_scores_by_task(captions: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """{task: mean score} over the video tasks present, in MOTION_TASKS order.

    ["a circle moving left", "a square moving up", "a circle staying still"] with scores
    [1, 0, 1] -> {"motion": 0.5, "static": 1.0}.
    """
    return mean_by_task(captions, scores, motion_task_of, MOTION_TASKS)
