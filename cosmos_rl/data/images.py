"""Image files <-> float tensors [3, H, W] in [0, 1].

Resize rule (used by every pair source): an image whose size already equals the
target is used untouched; otherwise it is scaled with bicubic filtering so that it
covers the target (the shorter relative side fits exactly) and then centre-cropped
to the target. Aspect ratio is therefore preserved and nothing is stretched; the
cropped margins are lost. Any Pillow mode (L, P, RGBA, ...) is converted to RGB with
``Image.convert("RGB")``, so an alpha channel is dropped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch
from PIL import Image

from cosmos_rl.core.files import read_user_bytes
from cosmos_rl.data.image_files import FIX, MAX_IMAGE_BYTES, open_image
from cosmos_rl.data.pixels import to_unit_float
from cosmos_rl.core.errors import UserError

ImageSize = Union[int, tuple[int, int]]


def as_height_width(size: ImageSize) -> tuple[int, int]:
    """``32`` -> ``(32, 32)``; ``(h, w)`` is checked and returned as is."""
    if isinstance(size, int):
        height, width = size, size
    else:
        height, width = size
    if height <= 0 or width <= 0:
        raise UserError(f"image size must be positive, got {size!r}")
    return int(height), int(width)


def _fit_and_crop(image: Image.Image, height: int, width: int) -> Image.Image:
    if image.size == (width, height):
        return image
    scale = max(width / image.width, height / image.height)
    # ceil so that rounding never leaves the scaled image a pixel short of the crop.
    scaled_w = max(width, math.ceil(image.width * scale))
    scaled_h = max(height, math.ceil(image.height * scale))
    image = image.resize((scaled_w, scaled_h), Image.Resampling.BICUBIC)
    left = (scaled_w - width) // 2
    top = (scaled_h - height) // 2
    return image.crop((left, top, left + width, top + height))


def _to_tensor(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image, dtype=np.uint8)  # [H, W, 3]
    return torch.from_numpy(to_unit_float(array)).permute(2, 0, 1)


def decode_image(data: bytes, size: ImageSize, origin: str) -> torch.Tensor:
    """Decode encoded image bytes (PNG, JPEG, WebP, ...) to float [3, H, W] in [0, 1].

    ``origin`` says where the bytes came from (file:line, shard and key) and is put in
    the error raised for undecodable data.
    """
    height, width = as_height_width(size)
    with open_image(data, origin) as image:
        try:
            image = image.convert("RGB")
        except (OSError, ValueError, SyntaxError) as exc:  # damage past the header (truncated pixels)
            raise UserError(f"{origin}: cannot decode image ({exc}); {FIX}") from exc
    return _to_tensor(_fit_and_crop(image, height, width))


def load_image(path: Union[str, Path], size: ImageSize, origin: str = "") -> torch.Tensor:
    """Read and decode an image file; errors name ``origin`` (if given) and the path."""
    where = f"{origin}: {path}" if origin else str(path)
    data = read_user_bytes(path, origin, "image file", MAX_IMAGE_BYTES)
    return decode_image(data, size, where)


def save_image_grid(
    images: Union[torch.Tensor, Sequence[torch.Tensor]], path: Union[str, Path], nrow: int
) -> Path:
    """Write images [N, 3, H, W] as one PNG grid, ``nrow`` images per row, 2 px black gaps.

    Values are clamped to [0, 1] first: decoded samples overshoot the range slightly and
    a preview should show them rather than fail. Parent folders are created.
    """
    batch = torch.stack(list(images)) if not isinstance(images, torch.Tensor) else images
    if batch.dim() != 4 or batch.shape[1] != 3 or batch.shape[0] == 0:
        raise ValueError(f"save_image_grid expects [N>0, 3, H, W], got {tuple(batch.shape)}")
    if nrow <= 0:
        raise ValueError(f"nrow must be positive, got {nrow}")
    count, _, height, width = batch.shape
    gap = 2
    cols = min(nrow, count)
    rows = math.ceil(count / cols)
    grid = torch.zeros(3, rows * height + (rows - 1) * gap, cols * width + (cols - 1) * gap)
    for index, image in enumerate(batch.detach().float().cpu().clamp(0.0, 1.0)):
        top = (index // cols) * (height + gap)
        left = (index % cols) * (width + gap)
        grid[:, top : top + height, left : left + width] = image
    # float32 x * 255, rounded: not data.pixels.to_uint8 (float64), which would move ~6e-6 of the
    # pixels of a grid of decoded samples by one level; grids of uint8 images come back exact.
    pixels = grid.mul(255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")
    return path
