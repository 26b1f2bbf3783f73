"""Spec + seed -> a ground-truth image (uint8 RGB, hard edges, exact palette colours).

Layout rules, which the verifier's tolerances are built around:

- every object's half-size is 16-20 % of the shorter image side (5.1-6.4 px at 32x32);
- bounding boxes stay one pixel inside the image and at least ``gap`` pixels apart (2 px, or
  6 % of the shorter side when larger), so no two objects touch and each is one component;
- squares are axis-aligned, triangles point up (apex at the top, base at the bottom);
- an object whose spec group names no colour gets a palette colour drawn from the seed;
- for a relation "A left of B", the centroids satisfy the verifier's rule with room to spare
  (:func:`cosmos_rl.shapes.spec.relation_holds`): dx exceeds both 1.5x the verifier's
  margin and 1.25x |dy|, so noise or a slight blur that moves a centroid by a pixel keeps it.

Each object goes to a spot drawn uniformly from the free box centres on a quarter-pixel grid.
The layout depends on the seed and the caption (not on other prompts), so one prompt's image
for one seed is the same in any batch, shard or process. The world starts at 32 px a side:
at 24, three objects of this size and spacing often have no room, and a circle's half-size
falls under 4 px, where a rasterised circle is a square block missing its corner pixels.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from cosmos_rl.shapes.spec import BACKGROUND, COLOURS, MIN_SIDE, RELATION_MARGIN, RGB, Spec, relation_offsets

ImageSize = Union[int, tuple[int, int]]

HALF_SIZE_RANGE = (0.16, 0.2)  # of the shorter side
MAX_TRIES = 100
GRID = 0.25  # px between candidate box centres


def height_width(size: ImageSize) -> tuple[int, int]:
    """``32`` -> ``(32, 32)``; ``(h, w)`` checked against MIN_SIDE."""
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    if min(height, width) < MIN_SIDE:
        raise ValueError(f"shapes images need at least {MIN_SIDE} px a side, got {size!r}")
    return int(height), int(width)


@dataclass(frozen=True)
class Placed:
    """One drawn object: bounding box centre (cx, cy) and half-size h, in pixels."""

    shape: str
    colour: str
    cx: float
    cy: float
    h: float

    @property
    def centroid(self) -> tuple[float, float]:
        """(x, y) of the filled area; an upright triangle's lies a third of h below its box centre."""
        return (self.cx, self.cy + self.h / 3 if self.shape == "triangle" else self.cy)


def _rng(spec: Spec, seed: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(spec.caption().encode())])


def _free_centres(shape: str, h: float, placed: list[Placed], relation: Optional[str],
                  height: int, width: int, phase: np.ndarray) -> np.ndarray:
    """[k, 2] box centres on a GRID-pixel grid (shifted by ``phase``) where an object of
    half-size h fits: inside the image by a pixel, ``gap`` clear of every placed box, and, for
    the second object of a relation, clearly on the right side of the first (module docstring)."""
    side = min(height, width)
    gap = max(2.0, 0.06 * side)
    xs = np.arange(h + 1 + phase[0], width - h - 1, GRID)
    ys = np.arange(h + 1 + phase[1], height - h - 1, GRID)
    cx, cy = (grid.reshape(-1) for grid in np.meshgrid(xs, ys))
    ok = np.ones(cx.shape, dtype=bool)
    for other in placed:
        reach = other.h + h + gap
        ok &= (np.abs(cx - other.cx) >= reach) | (np.abs(cy - other.cy) >= reach)
    if relation is not None and placed:
        centroid_y = cy + h / 3 if shape == "triangle" else cy
        along, across = relation_offsets(placed[0].centroid, (cx, centroid_y), relation)
        ok &= (along > 1.5 * RELATION_MARGIN * side) & (along > 1.25 * np.abs(across))
    return np.stack([cx[ok], cy[ok]], axis=1)


def layout(spec: Spec, seed: int, size: ImageSize = 32) -> list[Placed]:
    """The objects of ``spec`` placed for ``seed``, in group order (a group's objects together).

    Objects are placed one by one, each at a uniformly drawn free spot; when sizes drawn earlier
    leave no room (rare), all sizes are drawn again.
    """
    height, width = height_width(size)
    side = min(height, width)
    rng = _rng(spec, seed)
    wanted = [(g.shape, g.colour) for g in spec.groups for _ in range(g.count)]
    for _ in range(MAX_TRIES):
        placed: list[Placed] = []
        for shape, colour in wanted:
            h = side * rng.uniform(*HALF_SIZE_RANGE)
            free = _free_centres(shape, h, placed, spec.relation, height, width, rng.uniform(0, GRID, 2))
            if not len(free):
                break
            cx, cy = free[rng.integers(len(free))]
            placed.append(Placed(shape, colour or COLOURS[rng.integers(len(COLOURS))], float(cx), float(cy), h))
        else:
            return placed
    raise RuntimeError(f"no layout for {spec.caption()!r} at {height}x{width} in {MAX_TRIES} tries")


def _mask(obj: Placed, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Pixels whose centre lies inside the shape."""
    dx, dy = xs - obj.cx, ys - obj.cy
    if obj.shape == "square":
        return (np.abs(dx) <= obj.h) & (np.abs(dy) <= obj.h)
    if obj.shape == "circle":
        return dx * dx + dy * dy <= obj.h * obj.h
    # Apex (cx, cy - h), base from (cx - h, cy + h) to (cx + h, cy + h).
    return (dy <= obj.h) & (np.abs(dx) <= (dy + obj.h) / 2)


def draw(objects: list[Placed], size: ImageSize = 32) -> np.ndarray:
    """uint8 [H, W, 3] image of ``objects`` on the background."""
    height, width = height_width(size)
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[:] = RGB[BACKGROUND]
    ys = np.arange(height, dtype=np.float64)[:, None] + 0.5
    xs = np.arange(width, dtype=np.float64)[None, :] + 0.5
    for obj in objects:
        image[_mask(obj, ys, xs)] = RGB[obj.colour]
    return image


def render(spec: Spec, seed: int, size: ImageSize = 32) -> np.ndarray:
    """Ground-truth uint8 [H, W, 3] image of ``spec``; the same for the same (spec, seed, size)."""
    return draw(layout(spec, seed, size), size)
