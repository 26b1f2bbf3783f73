"""Per-frame objects -> tracks across a clip, and what a track's path does over time.

Objects are found in each frame by the image world's rules (:func:`cosmos_rl.shapes.analyse.detect`).
A *track* is one object followed through the clip: detections of one colour and shape are linked
from frame to frame by nearest centroid (all pairs of this class's tracks and the frame's
detections, nearest first, each used once). A track the frame has no detection for waits, and
the next detection of its class may pick it up again, so an object that flickers out for a frame
stays one track that is missing in that frame; a detection left over starts a new track.

The path rules, with the tolerances of :mod:`cosmos_rl.shapes.motion_spec` (as fractions of the
frame side along the motion's axis for travel, of the shorter side otherwise; 32x32 in brackets):

- **direction**: the net displacement along it, first to last seen frame, is at least MIN_TRAVEL
  (8 px); no step between seen frames goes back by more than BACKSTEP (1.6 px); the path never
  strays more than DRIFT (3.2 px) across the direction from where it started;
- **turn**: some seen frame splits the path into a leg in the first direction and one in the
  second, each by the direction rule;
- **still**: every seen position within STILL (1.6 px) of the first;
- **colour change**: seen in the first and last frame, in the first colour at the first and the
  second at the last, switching colour once, jumping at most SWITCH_JUMP (3.2 px) at the switch.

Every rule needs the object in at least two frames. A rule returns None when it holds, else what
failed, in words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from cosmos_rl.shapes.analyse import Found
from cosmos_rl.shapes.motion_spec import BACKSTEP, DIRECTIONS, DRIFT, MIN_TRAVEL, STILL, SWITCH_JUMP

Path = tuple[Optional[Found], ...]  # one entry per frame, None where the object is not seen


@dataclass(frozen=True)
class Track:
    """One followed object: its per-frame detections (all of one colour and shape)."""

    path: Path

    @property
    def seen(self) -> list[int]:
        return [t for t, obj in enumerate(self.path) if obj is not None]

    @property
    def first(self) -> Found:
        return next(obj for obj in self.path if obj is not None)

    def describe(self) -> str:
        seen = self.seen
        frames = f"frame {seen[0]}" if len(seen) == 1 else f"frames {seen[0]}-{seen[-1]}"
        if len(seen) not in (1, seen[-1] - seen[0] + 1):
            frames = "frames " + ",".join(map(str, seen))
        return f"{self.first.colour} {self.first.shape} in {frames}"


def link(frames: Sequence[Sequence[Found]]) -> list[Track]:
    """The tracks of one clip's per-frame detections, in the order they start (module docstring)."""
    n = len(frames)
    paths: list[list[Optional[Found]]] = []
    for t, found in enumerate(frames):
        classes: dict[tuple[str, str], list[Found]] = {}
        for obj in found:
            classes.setdefault((obj.colour, obj.shape), []).append(obj)
        for (colour, shape), objs in classes.items():
            open_ = [i for i, p in enumerate(paths) if _klass(p) == (colour, shape)]
            pairs = sorted((_distance(_last(paths[i]), obj), i, j) for i in open_ for j, obj in enumerate(objs))
            taken_tracks, taken_objs = set(), set()
            for _, i, j in pairs:
                if i not in taken_tracks and j not in taken_objs:
                    paths[i][t] = objs[j]
                    taken_tracks.add(i)
                    taken_objs.add(j)
            for j, obj in enumerate(objs):
                if j not in taken_objs:
                    paths.append([None] * n)
                    paths[-1][t] = obj
    return [Track(tuple(p)) for p in paths]


def _klass(path: list[Optional[Found]]) -> tuple[str, str]:
    obj = next(o for o in path if o is not None)
    return obj.colour, obj.shape


def _last(path: list[Optional[Found]]) -> Found:
    return next(o for o in reversed(path) if o is not None)


def _distance(a: Found, b: Found) -> float:
    return float(np.hypot(a.x - b.x, a.y - b.y))


def merge(a: Track, b: Track) -> Optional[Path]:
    """One path from two tracks seen in different frames (a colour change), else None."""
    if set(a.seen) & set(b.seen):
        return None
    return tuple(x if x is not None else y for x, y in zip(a.path, b.path))


def _seen(path: Path) -> list[Found]:
    return [obj for obj in path if obj is not None]


def direction_failure(points: Sequence[Found], direction: str, height: int, width: int) -> Optional[str]:
    if len(points) < 2:
        return f"is seen in fewer than 2 frames, so does not move {direction}"
    dx, dy = DIRECTIONS[direction]
    along = np.array([dx * p.x + dy * p.y for p in points])
    across = np.array([abs(dy) * p.x + abs(dx) * p.y for p in points])
    side = min(height, width)
    need = MIN_TRAVEL * (width if dx else height)
    travel = along[-1] - along[0]
    if travel < need:
        return f"travels {travel:.1f} px {direction}, needs {need:.1f}"
    back = float(np.max(along[:-1] - along[1:]))
    if back > BACKSTEP * side:
        return f"steps {back:.1f} px back while moving {direction} (at most {BACKSTEP * side:.1f})"
    drift = float(np.max(np.abs(across - across[0])))
    if drift > DRIFT * side:
        return f"drifts {drift:.1f} px across while moving {direction} (at most {DRIFT * side:.1f})"
    return None


def turn_failure(points: Sequence[Found], first: str, second: str, height: int, width: int) -> Optional[str]:
    if len(points) < 3:
        return f"is seen in fewer than 3 frames, so does not move {first} then {second}"
    for k in range(1, len(points) - 1):
        if direction_failure(points[: k + 1], first, height, width) is None and \
                direction_failure(points[k:], second, height, width) is None:
            return None
    whole = direction_failure(points, first, height, width)
    hint = f" (it moves {first} all along)" if whole is None else ""
    return f"does not move {first} then {second} at any split{hint}"


def still_failure(points: Sequence[Found], height: int, width: int) -> Optional[str]:
    if len(points) < 2:
        return "is seen in fewer than 2 frames, so is not seen staying still"
    moved = max(np.hypot(p.x - points[0].x, p.y - points[0].y) for p in points)
    limit = STILL * min(height, width)
    if moved > limit:
        return f"moves {moved:.1f} px while staying still (at most {limit:.1f})"
    return None


def change_failure(path: Path, first: str, last: str, height: int, width: int) -> Optional[str]:
    if path[0] is None or path[-1] is None:
        return f"is not seen in the {'first' if path[0] is None else 'last'} frame, so its colours there are unknown"
    if path[0].colour != first or path[-1].colour != last:
        return f"is {path[0].colour} in the first frame and {path[-1].colour} in the last, not {first} then {last}"
    points = _seen(path)
    switches = [i for i in range(1, len(points)) if points[i].colour != points[i - 1].colour]
    if len(switches) != 1:
        return f"switches colour {len(switches)} times, not once"
    a, b = points[switches[0] - 1], points[switches[0]]
    jump, limit = float(np.hypot(a.x - b.x, a.y - b.y)), SWITCH_JUMP * min(height, width)
    if jump > limit:
        return f"jumps {jump:.1f} px where its colour switches (at most {limit:.1f})"
    return None
