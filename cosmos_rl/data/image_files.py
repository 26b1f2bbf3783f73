"""Opening a user's encoded image (PNG, JPEG, WebP, ...) with Pillow; torch-free.

The run decodes through :func:`open_image` (``images.decode_image``) and ``validate`` checks
through :func:`check_image`, so both word a bad image the same way: ``origin`` says where the
bytes came from (``file:line`` and side, or shard and sample key) and every failure is a
``UserError`` naming it. Pillow refuses images above twice ``Image.MAX_IMAGE_PIXELS`` (a
decompression bomb); that limit is kept, and reported as the image's size problem.
"""

from __future__ import annotations

import io
from typing import BinaryIO, Union

from PIL import Image, UnidentifiedImageError

from cosmos_rl.core.errors import UserError

FIX = "replace it with a valid PNG/JPEG/WebP file"
# An encoded image's bytes (a file, or a tar member read whole): an 8K RGB PNG stored without any
# compression is ~100 MB, so no image a run can train on is larger.
MAX_IMAGE_BYTES = 128 << 20


def open_image(data: Union[bytes, BinaryIO], origin: str) -> Image.Image:
    """A lazily decoding Pillow image; only the header has been read."""
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    try:
        return Image.open(stream)
    except Image.DecompressionBombError as exc:
        raise UserError(f"{origin}: cannot decode image: too large to decode safely ({exc}); downscale it") from exc
    except UnidentifiedImageError as exc:
        # Pillow's own text names only the in-memory stream, never the file.
        raise UserError(f"{origin}: cannot decode image: not a format Pillow identifies (empty, damaged or not an image); {FIX}") from exc
    except (OSError, ValueError, SyntaxError) as exc:
        raise UserError(f"{origin}: cannot decode image: bad header ({exc}); {FIX}") from exc


def check_image(data: Union[bytes, BinaryIO], origin: str) -> None:
    """Open and verify an image without decoding its pixels (PNG: every chunk's CRC is checked)."""
    image = open_image(data, origin)
    try:
        image.verify()
    except Exception as exc:  # noqa: BLE001 - each Pillow plugin's parser raises its own kinds
        raise UserError(f"{origin}: cannot decode image: damaged {image.format or 'image'} data ({type(exc).__name__}: {exc}); {FIX}") from exc
    finally:
        image.close()
