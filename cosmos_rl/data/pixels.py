"""Float pixels in [0, 1] <-> uint8 0..255: the one conversion of the project.

`to_uint8` is what every sample crosses on its way to a reward (the reward wire, `cosmos-rl eval`,
`[rl.eval]`, `pairs mine` and so the mined shards): x * 255 in float64 (exact for float32 input),
rounded to nearest with ties to even, clipped to 0..255 (as DDPO does before JPEG encoding).
`to_unit_float` is the way back for decoded files and grids: k / 255 as float32.

One older float32 copy is kept where changing it would move bytes: the sample-grid writer
(`data/images.save_image_grid`) rounds x * 255 computed in float32, which lands on the other side
of a tie for about 6 in 10^6 pixels. (The shapes base scorer had the other copy; it samples
through `models.generate` now, see `shapes/held_out.sample_images`.)
"""

from __future__ import annotations

import numpy as np


def to_uint8(images: np.ndarray) -> np.ndarray:
    """Float images in [0, 1] -> uint8 (see the module docstring); uint8 images pass through."""
    if images.dtype == np.uint8:
        return images
    return np.clip(np.rint(np.asarray(images, dtype=np.float64) * 255.0), 0, 255).astype(np.uint8)


def to_unit_float(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float32 in [0, 1], k / 255 correctly rounded (what `Tensor.float() / 255` gives)."""
    if pixels.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {pixels.dtype}")
    return pixels.astype(np.float32) / np.float32(255.0)
