"""Video spec + seed -> a ground-truth clip: uint8 [F, H, W, 3] frames drawn by the image world.

Every frame is an image-world picture (:func:`cosmos_rl.shapes.scene.draw`: the same shapes,
palette colours, hard edges and black background), and each object moves in a straight line:

- ``move``: a constant velocity, no sideways motion, travelling over the clip a whole number of
  pixels from ``ceil(MIN_TRAVEL * side + 1)`` to ``floor(0.4 * side)``, ``side`` the frame side
  along the motion (9-12 px at 32): a whole-pixel shift draws the same pixels shifted, so the
  verifier measures exactly that travel, at least a pixel over its MIN_TRAVEL (8 px);
- ``turn``: the first direction up to the middle frame ``(F - 1) // 2``, the second after it,
  each leg travelling as a ``move`` does;
- ``still`` and ``change``: no motion; a colour change switches at frame ``F // 2``;
- a group of two or three ("two circles moving left") moves as one formation, all at one
  velocity; three travel the least (9 px at 32), as two rows of objects this size leave a
  32 px frame no room to travel more.

Layout rules (checked at every frame): every object's half-size is 14.5-15.5 % of the shorter
side (4.64-4.96 px at 32x32: smaller than the image world's 16-20 % so that three objects in a
formation still travel a quarter of the frame; a rasterised circle under 4.6 px, or of 5.00-5.04
px, is sometimes read as a square under a slight blur); boxes stay half a pixel inside the frame
and at least ``gap`` pixels apart (as in the image world), so no object leaves the frame, touches
another or merges with one. An object whose clause names no colour gets a palette colour drawn
from the seed. A clip depends on the caption, the seed, the size and the frame count only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from cosmos_rl.shapes.motion_caption import parse_motion_caption
from cosmos_rl.shapes.motion_spec import DIRECTIONS, MIN_TRAVEL, Clause, MotionSpec
from cosmos_rl.shapes.scene import GRID, ImageSize, Placed, draw, height_width
from cosmos_rl.shapes.spec import COLOURS

HALF_SIZE_RANGE = (0.145, 0.155)  # of the shorter side
MAX_TRAVEL = 0.4  # of the side along the motion
EDGE = 0.5  # px between a box and the frame's border, at least
MIN_FRAMES = 3  # a turn needs a frame between its two legs
DEFAULT_FRAMES = 9
MAX_TRIES = 300


@dataclass(frozen=True)
class Mover:
    """One object of a clip: its shape and half-size, and per frame its colour and box centre."""

    shape: str
    h: float
    colours: tuple[str, ...]
    centres: tuple[tuple[float, float], ...]

    def at(self, frame: int) -> Placed:
        cx, cy = self.centres[frame]
        return Placed(self.shape, self.colours[frame], cx, cy, self.h)


def check_frames(frames: int) -> int:
    if not isinstance(frames, (int, np.integer)) or isinstance(frames, bool) or frames < MIN_FRAMES:
        raise ValueError(f"shapes clips need at least {MIN_FRAMES} frames, got {frames!r}")
    return int(frames)


def _rng(spec: MotionSpec, seed: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(spec.caption().encode())])


def _leg(direction: str, count: int, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """The displacement (dx, dy) of one straight leg: a whole number of pixels (module docstring)."""
    dx, dy = DIRECTIONS[direction]
    side = width if dx else height
    low = int(np.ceil(MIN_TRAVEL * side + 1))
    high = low if count == 3 else max(low, int(np.floor(MAX_TRAVEL * side)))
    return np.array([dx, dy], dtype=np.float64) * int(rng.integers(low, high + 1))


def _offsets(clause: Clause, frames: int, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """[F, 2] box-centre offsets from the first frame for a clause's action."""
    t = np.arange(frames, dtype=np.float64)[:, None]
    if clause.action == "move":
        return _leg(clause.args[0], clause.group.count, rng, height, width) * t / (frames - 1)
    if clause.action == "turn":
        first, second = (_leg(d, 1, rng, height, width) for d in clause.args)
        k = (frames - 1) // 2
        return np.where(t <= k, first * t / k, first + second * (t - k) / (frames - 1 - k))
    return np.zeros((frames, 2))


def _free_starts(h: float, offsets: np.ndarray, placed: list[Mover], height: int, width: int,
                 phase: np.ndarray) -> np.ndarray:
    """[k, 2] first-frame box centres (GRID-pixel grid shifted by ``phase``) from which an object
    of half-size h following ``offsets`` stays EDGE inside the frame and ``gap`` clear of every
    placed object at every frame."""
    gap = max(2.0, 0.06 * min(height, width))
    xs = np.arange(EDGE + h - offsets[:, 0].min() + phase[0], width - EDGE - h - offsets[:, 0].max(), GRID)
    ys = np.arange(EDGE + h - offsets[:, 1].min() + phase[1], height - EDGE - h - offsets[:, 1].max(), GRID)
    cx, cy = (grid.reshape(-1) for grid in np.meshgrid(xs, ys))
    ok = np.ones(cx.shape, dtype=bool)
    for other in placed:
        reach = other.h + h + gap
        centres = np.asarray(other.centres)  # [F, 2]
        apart_x = np.abs(cx[:, None] + offsets[None, :, 0] - centres[None, :, 0]) >= reach
        apart_y = np.abs(cy[:, None] + offsets[None, :, 1] - centres[None, :, 1]) >= reach
        ok &= (apart_x | apart_y).all(axis=1)
    return np.stack([cx[ok], cy[ok]], axis=1)


def _colours(clause: Clause, frames: int, rng: np.random.Generator) -> tuple[str, ...]:
    if clause.action == "change":
        first, last = clause.args
        return (first,) * (frames // 2) + (last,) * (frames - frames // 2)
    return (clause.group.colour or COLOURS[rng.integers(len(COLOURS))],) * frames


def _try_layout(spec: MotionSpec, rng: np.random.Generator, height: int, width: int, frames: int) -> Optional[list[Mover]]:
    side = min(height, width)
    movers: list[Mover] = []
    for clause in spec.clauses:
        offsets = _offsets(clause, frames, rng, height, width)
        for _ in range(clause.group.count):
            h = side * rng.uniform(*HALF_SIZE_RANGE)
            free = _free_starts(h, offsets, movers, height, width, rng.uniform(0, GRID, 2))
            if not len(free):
                return None
            cx, cy = free[rng.integers(len(free))]
            centres = tuple((float(cx + dx), float(cy + dy)) for dx, dy in offsets)
            movers.append(Mover(clause.group.shape, h, _colours(clause, frames, rng), centres))
    return movers


def clip_layout(spec: MotionSpec, seed: int, size: ImageSize = 32, frames: int = DEFAULT_FRAMES) -> list[Mover]:
    """The objects of ``spec`` for ``seed``, in clause order (a group's objects together).

    Objects are placed one by one at a uniformly drawn free start; when earlier draws leave no
    room (often for three objects in formation), everything is drawn again.
    """
    height, width = height_width(size)
    frames = check_frames(frames)
    rng = _rng(spec, seed)
    for _ in range(MAX_TRIES):
        movers = _try_layout(spec, rng, height, width, frames)
        if movers is not None:
            return movers
    raise RuntimeError(f"no layout for {spec.caption()!r} at {height}x{width}x{frames} in {MAX_TRIES} tries")


def draw_clip(movers: list[Mover], size: ImageSize = 32) -> np.ndarray:
    """uint8 [F, H, W, 3] frames of ``movers`` (all with the same number of frames)."""
    frames = {len(m.centres) for m in movers}
    if len(frames) != 1:
        raise ValueError(f"movers disagree on the number of frames: {sorted(frames)}")
    return np.stack([draw([m.at(t) for m in movers], size) for t in range(frames.pop())])


def render_clip(spec: Union[MotionSpec, str], seed: int, size: ImageSize = 32, frames: int = DEFAULT_FRAMES) -> np.ndarray:
    """Ground-truth uint8 [F, H, W, 3] clip of a video spec or caption; the same for the same arguments."""
    if isinstance(spec, str):
        spec = parse_motion_caption(spec)
    return draw_clip(clip_layout(spec, seed, size, frames), size)
