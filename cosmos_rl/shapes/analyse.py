"""Image -> the objects in it: colour segmentation, components, shape from fill and reach.

1. **Colour.** A pixel takes the background or palette colour whose every channel it is within
   ``tolerance`` of (0..255), else it is unassigned. The background and palette colours have
   channels of 0 or 255 only (corners of the RGB cube), so any tolerance below 127.5 is
   unambiguous and treats one-channel colours (red) like two-channel ones (yellow); the
   default 100 keeps a pixel under noise of std 10 per channel and drops a pixel on a blurred
   edge that is more than about 40 % background.
2. **Objects.** 4-connected components of one palette colour; components smaller than
   MIN_AREA of the image (specks) are ignored, every other one is an object, whatever it
   looks like.
3. **Shape**, from three numbers of the component: its fill ratio (area / box area), how far
   it reaches along the diagonals relative to along the axes (a square reaches sqrt 2 = 1.41
   times as far, a circle 1, an upright triangle about 1.1), and how far it reaches up from its
   centroid relative to down (an upright triangle 2, a circle or square 1):

   ========  ==========  =============  ========
   shape     fill        diagonal/axis  up/down
   ========  ==========  =============  ========
   square    >= 0.85     >= 1.2         0.77-1.3
   circle    0.55-0.95   < 1.2          0.77-1.3
   triangle  0.4-0.85    any            >= 1.3
   ========  ==========  =============  ========

   and the box's width / height within 0.67-1.5 for all three; anything else is ``"other"``.
   Measured on 800 renders of each shape at 32x32, clean and under noise (std up to 15) and
   blur (sigma up to 1): circles diagonal/axis 0.90-1.16 and up/down 0.83-1.19, fill
   0.60-0.89; squares 1.25-1.41, 0.96-1.05, fill >= 0.93; triangles up/down 1.39-1.98, fill
   0.50-0.75. Reaches depend on every pixel of the rim rather than on the one or two that
   make a box corner, so a blurred edge that loses its outermost pixels barely moves them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosmos_rl.shapes.components import components
from cosmos_rl.shapes.spec import BACKGROUND, COLOURS, MIN_SIDE, RGB

COLOUR_TOLERANCE = 100
MIN_AREA = 0.008  # of the image: objects have >= 9 px at 32x32; the smallest rendered one has ~50

_REFERENCE = np.array([RGB[BACKGROUND]] + [RGB[c] for c in COLOURS], dtype=np.int16)


@dataclass(frozen=True)
class Found:
    """One object seen in an image: its colour, shape (or "other") and centroid (x, y) in pixels."""

    colour: str
    shape: str
    x: float
    y: float
    area: int

    def describe(self) -> str:
        return f"{self.colour} {self.shape} at ({self.x:.1f}, {self.y:.1f})"


def check_pixels(array: np.ndarray, what: str, axes: str) -> None:
    """ValueError unless ``array`` (the world's ``what``: images, clips) is a uint8 numpy array
    shaped [``axes``], RGB last."""
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise ValueError(f"shapes {what} must be a uint8 numpy array, got {got}")
    if array.ndim != len(axes.split(", ")) or array.shape[-1] != 3:
        raise ValueError(f"shapes {what} must be shaped [{axes}], got {array.shape}")


def check_side(array: np.ndarray, what: str) -> None:
    """ValueError unless both sides of ``array``'s pictures (the axes before RGB) are >= MIN_SIDE."""
    if min(array.shape[-3:-1]) < MIN_SIDE:
        raise ValueError(f"shapes {what} need at least {MIN_SIDE} px a side, got {array.shape[-3:-1]}")


def check_batch(images: np.ndarray) -> None:
    """ValueError unless ``images`` is uint8 [N, H, W, 3] with both sides >= MIN_SIDE."""
    check_pixels(images, "images", "N, H, W, 3")
    check_side(images, "images")


def segment(images: np.ndarray, tolerance: float = COLOUR_TOLERANCE) -> np.ndarray:
    """int [N, H, W]: 0 background, 1 + palette index for a palette colour, -1 unassigned.

    (250, 30, 5) -> red (every channel within 100 of (255, 0, 0)); (255, 128, 0), orange, -> -1
    (its green channel is 128 from both 0 and 255); (255, 255, 255), white, -> -1 (not a
    colour of the world).
    """
    distance = np.zeros(images.shape[:3] + (len(_REFERENCE),), dtype=np.int16)
    for channel in range(3):
        np.maximum(distance, np.abs(images[..., channel, None].astype(np.int16) - _REFERENCE[:, channel]), out=distance)
    nearest = distance.argmin(axis=-1)
    close = np.take_along_axis(distance, nearest[..., None], axis=-1)[..., 0] <= tolerance
    return np.where(close, nearest, -1)


def classify(fill: np.ndarray, diagonal: np.ndarray, up_down: np.ndarray, aspect: np.ndarray) -> list[str]:
    """Shape names by the table in the module docstring (all arguments are per component).

    An ideal square (fill 1, diagonal/axis 1.41, up/down 1) -> "square"; fill 0.78, 1.0, 1.0
    -> "circle"; fill 0.5, 1.1, 2.0 -> "triangle"; a diamond (fill 0.5, diagonal/axis 0.71,
    up/down 1) -> "other"; an inverted triangle (up/down 0.5) -> "other"; a 20x5 bar (aspect 4)
    -> "other".
    """
    upright = (aspect >= 0.67) & (aspect <= 1.5)
    level = upright & (up_down >= 1 / 1.3) & (up_down < 1.3)
    square = level & (fill >= 0.85) & (diagonal >= 1.2)
    circle = level & (fill >= 0.55) & (fill < 0.95) & (diagonal < 1.2)
    triangle = upright & (fill >= 0.4) & (fill < 0.85) & (up_down >= 1.3)
    return [
        "square" if s else "circle" if c else "triangle" if t else "other"
        for s, c, t in zip(square, circle, triangle)
    ]


def detect(images: np.ndarray, tolerance: float = COLOUR_TOLERANCE) -> list[list[Found]]:
    """The objects in each uint8 [N, H, W, 3] image, in order of their first pixel."""
    check_batch(images)
    n, height, width = images.shape[:3]
    classes = segment(images, tolerance)
    parts = components(np.where(classes > 0, classes, 0))
    keep = parts.area >= MIN_AREA * height * width
    box_w = (parts.x1 - parts.x0 + 1)[keep]
    box_h = (parts.y1 - parts.y0 + 1)[keep]
    reach = parts.reach[keep]
    shapes = classify(
        parts.area[keep] / (box_w * box_h),
        reach[:, 4:].mean(axis=1) / reach[:, :4].mean(axis=1),
        reach[:, 3] / reach[:, 2],
        box_w / box_h,
    )
    found: list[list[Found]] = [[] for _ in range(n)]
    for image, klass, x, y, area, shape in zip(
        parts.image[keep], parts.klass[keep], parts.cx[keep], parts.cy[keep], parts.area[keep], shapes
    ):
        found[int(image)].append(Found(COLOURS[int(klass) - 1], shape, float(x), float(y), int(area)))
    return found
