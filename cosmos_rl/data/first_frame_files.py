"""Image-to-video conditioning frames named by a prompt file (`[model.condition]` source `"image"`); torch-free.

`validate --data` checks a frame through :func:`check_first_frame` and the run reads it through
:func:`read_first_frame`, so both refuse a bad file in the same words, naming ``file:line`` of the
prompt row: a missing or undecodable file, a decompression bomb (Pillow's limit, as
`data/image_files` keeps it) or a frame whose size is not the run's clip size. A frame is never
resized: the model is conditioned on exactly the pixels the file holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosmos_rl.core.files import open_user_file
from cosmos_rl.data.image_files import FIX, MAX_IMAGE_BYTES, open_image
from cosmos_rl.core.errors import UserError


def missing(prompt_file: Path, line: int) -> UserError:
    """The problem of a row that names no frame in an image-to-video run."""
    return UserError(f'{prompt_file}:{line}: no "image" field, and model.condition.source = "image" conditions every row on one; '
                     'add "image": "PATH" (relative to the prompt file) to the row')


def _opened(path: Path, origin: str, height: int, width: int):
    # A FIFO, a device, a NUL in the name or a file past MAX_IMAGE_BYTES is refused by core.files.
    handle = open_user_file(path, origin, "conditioning image", MAX_IMAGE_BYTES)
    try:
        image = open_image(handle, f"{origin}: {path}")
    except BaseException:
        handle.close()
        raise
    if image.size != (width, height):
        image.close()
        raise UserError(f"{origin}: the conditioning image {path} is {image.size[0]}x{image.size[1]}, the run's clips are "
                        f"{width}x{height}; resize it to {width}x{height} (width x height)")  # fmt: skip
    return image


def check_first_frame(path: Path, origin: str, height: int, width: int) -> None:
    """Open and verify the frame's header and size without decoding its pixels (PNG: chunk CRCs too)."""
    image = _opened(path, origin, height, width)
    try:
        image.verify()
    except Exception as exc:  # noqa: BLE001 - each Pillow plugin's parser raises its own kinds
        raise UserError(f"{origin}: {path}: cannot decode image: damaged {image.format or 'image'} data ({exc}); {FIX}") from exc
    finally:
        image.close()


def read_first_frame(path: Path, origin: str, height: int, width: int) -> np.ndarray:
    """The frame as uint8 [H, W, 3] RGB (an alpha channel or palette is converted, as a clip frame has none)."""
    image = _opened(path, origin, height, width)
    try:
        return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    except Exception as exc:  # noqa: BLE001 - truncated data surfaces only when decoding
        raise UserError(f"{origin}: {path}: cannot decode image: damaged {image.format or 'image'} data ({exc}); {FIX}") from exc
    finally:
        image.close()
