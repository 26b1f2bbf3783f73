"""Clip files (mp4) <-> float tensors [3, F, H, W] in [0, 1]: the clip twin of :mod:`cosmos_rl.data.images`.

Decoding is :func:`cosmos_rl.data.clip_files.read_clip` (every check and limit is there); this
module only turns its uint8 frames into the layout the models use (channels, then time), with
:func:`cosmos_rl.data.pixels.to_unit_float`. Clips are never resized: every frame must already be
the expected height x width, and the clip must hold exactly the expected number of frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import MAX_CLIP_BYTES, open_user_file
from cosmos_rl.data.clip_files import ClipData, read_clip
from cosmos_rl.data.pixels import to_unit_float


def decode_clip(data: ClipData, frames: int, height: int, width: int, origin: str) -> torch.Tensor:
    """Decode mp4 bytes to float [3, frames, height, width] in [0, 1]; errors name ``origin``."""
    pixels = read_clip(data, frames, height, width, origin)  # [F, H, W, 3]
    return torch.from_numpy(to_unit_float(pixels)).permute(3, 0, 1, 2).contiguous()


def load_clip(path: Union[str, Path], frames: int, height: int, width: int, origin: str = "") -> torch.Tensor:
    """Read and decode a clip file; errors name ``origin`` (if given) and the path."""
    where = f"{origin}: {path}" if origin else str(path)
    with open_user_file(path, origin, "clip file", MAX_CLIP_BYTES) as handle:
        try:
            return decode_clip(handle, frames, height, width, where)
        except OSError as exc:
            raise UserError(f"{where}: cannot read clip file ({exc.strerror or exc}); check the path") from exc
