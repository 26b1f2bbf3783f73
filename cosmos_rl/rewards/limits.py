"""What one /score request may cost the service, and image decoding that checks it first.

Every limit is checked before the work it bounds: the body size before the body is read, each
image's side and pixel count from its PNG header before a single row is decompressed, and the
request's total decoded bytes before any image is decoded. A 445 KB PNG that claims 12000x12000
pixels is refused from its 33-byte header, so it never costs the 432 MB it would decode to.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Sequence

import attrs
import numpy as np
from PIL import Image, UnidentifiedImageError


class BadRequest(Exception):
    """A malformed or over-limit request; answered with `status` and this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@attrs.frozen(kw_only=True)
class Limits:
    """Per-request and per-service bounds (defaults fit a few dozen 1024x1024 images per request)."""

    max_body_bytes: int = 128 << 20
    max_images: int = 256
    max_side: int = 4096
    max_pixels: int = 4096 * 4096
    max_request_pixels: int = 64 * 1024 * 1024
    # All requests in flight together: bodies being held plus the pixels they decode to.
    max_inflight_bytes: int = 1 << 30
    # A client must send its headers, and then its body, within these (slow clients are cut off).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # From a complete body to the scores: the wait in the batch queue plus the scoring itself.
    score_timeout_s: float = 300.0

    def __attrs_post_init__(self):
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"Limits.{field.name} must be a positive finite number, got {value!r}")


def _field_type(value) -> str:
    return "null" if value is None else type(value).__name__


def parse_fields(request: object, rewards: Sequence[str], limits: Limits) -> tuple[str, list[str], list]:
    """(reward, prompts, encoded images) of a decoded JSON body, or BadRequest naming the field."""
    if not isinstance(request, dict):
        raise BadRequest(f"body must be a JSON object with reward, prompts and images, got {_field_type(request)}")
    missing = [k for k in ("reward", "prompts", "images") if k not in request]
    if missing:
        raise BadRequest(f"missing fields {missing}")
    reward, prompts, images = request["reward"], request["prompts"], request["images"]
    if not isinstance(reward, str):
        raise BadRequest(f"reward must be a string naming one of {sorted(rewards)}, got {_field_type(reward)}")
    if reward not in rewards:
        raise BadRequest(f"unknown reward {reward!r}; this service offers {sorted(rewards)}")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise BadRequest("prompts must be a list of strings")
    if not isinstance(images, list):
        raise BadRequest(f"images must be a list of base64 PNG strings, got {_field_type(images)}")
    if not images:
        raise BadRequest("images is empty; send at least one image")
    if len(images) > limits.max_images:
        raise BadRequest(f"{len(images)} images in one request, over the limit of {limits.max_images}; split it", 413)
    if len(prompts) != len(images):
        raise BadRequest(f"got {len(images)} images but {len(prompts)} prompts")
    for i, item in enumerate(images):
        if not isinstance(item, str):
            raise BadRequest(f"images[{i}] must be a base64 string, got {_field_type(item)}")
    return reward, prompts, images


def open_images(encoded: Sequence[str], limits: Limits) -> list[Image.Image]:
    """Base64 PNGs -> lazily opened images whose headers passed every limit (nothing decoded yet)."""
    opened, total, sizes = [], 0, set()
    for i, item in enumerate(encoded):
        try:
            raw = base64.b64decode(item, validate=True)
            image = Image.open(io.BytesIO(raw), formats=["PNG"])  # reads the header only
        except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as exc:
            raise BadRequest(f"images[{i}] is not a base64-encoded PNG: {exc}") from None
        except Image.DecompressionBombError as exc:  # pragma: no cover - our limits are lower
            raise BadRequest(f"images[{i}]: {exc}", 413) from None
        width, height = image.size
        if max(width, height) > limits.max_side:
            raise BadRequest(f"images[{i}] is {width}x{height}, over the side limit of {limits.max_side}", 413)
        if width * height > limits.max_pixels:
            raise BadRequest(f"images[{i}] has {width * height} pixels, over the limit of {limits.max_pixels}", 413)
        if image.mode != "RGB":
            # Converting RGBA/L here would score something other than what the model made.
            raise BadRequest(f"images[{i}] has mode {image.mode}; send RGB images")
        total += width * height
        sizes.add((height, width))
        opened.append(image)
    if total > limits.max_request_pixels:
        raise BadRequest(f"the request's images hold {total} pixels, over the limit of {limits.max_request_pixels}; split it", 413)
    if len(sizes) != 1:
        raise BadRequest(f"all images in one request must share a size, got {sorted(sizes)}")
    return opened


def decoded_bytes(images: Sequence[Image.Image]) -> int:
    """Bytes the opened images take once decoded to uint8 RGB."""
    return sum(im.size[0] * im.size[1] * 3 for im in images)


def decode(images: Sequence[Image.Image]) -> np.ndarray:
    """Opened (header-checked) images -> uint8 [N, H, W, 3]; a truncated or corrupt one is a 400."""
    height, width = images[0].size[1], images[0].size[0]
    out = np.empty((len(images), height, width, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        try:
            image.load()
            out[i] = np.asarray(image, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as exc:
            raise BadRequest(f"images[{i}] does not decode: {exc}") from None
        finally:
            image.close()
    return out
