"""Image bytes for data tests: a real small PNG, and a 20000x20000 PNG that is only a header."""

import io
import struct
import zlib

import numpy as np
from PIL import Image


def png_bytes(rgb=(255, 0, 0), size=8) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), rgb, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(side: int = 20000) -> bytes:
    """A well-formed PNG header declaring side x side RGB pixels (400 M at 20000, over Pillow's
    limit of 2 x 89.5 M); Pillow refuses it at open, before reading any pixel data."""
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"\0" * 16)) + _chunk(b"IEND", b"")
