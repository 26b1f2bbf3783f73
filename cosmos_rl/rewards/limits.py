"""What one /score request may cost the service, and image decoding that checks it first.

Every limit is checked before the work it bounds: the body size before the body is read, the
frame counts of a clips request from the JSON lists' lengths before any frame is looked at, each
image's (or frame's) side and pixel count from its PNG header before a single row is decompressed,
and the request's total decoded bytes before anything is decoded. A 445 KB PNG that claims
12000x12000 pixels is refused from its 33-byte header, so it never costs the 432 MB it would
decode to; a clip that claims a million frames is refused from its length.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence

import attrs
import numpy as np
from PIL import Image, UnidentifiedImageError

# Defaults of the per-request limits (Limits). Frames of clips count as images for the side and
# pixel limits; the request's pixels are every image's or every frame's together.
MAX_IMAGES = 256
MAX_CLIP_FRAMES = 256  # frames of one clip (a 720p Cosmos3 clip has 93, 480p 17)
MAX_REQUEST_FRAMES = 1024  # frames of every clip of one request together
MAX_REQUEST_PIXELS = 64 * 1024 * 1024
MAX_ACTION_WIDTH = 64  # numbers per action row (the widest Cosmos3 embodiment, hand_pose, has 57)


class BadRequest(Exception):
    """A malformed or over-limit request; answered with `status` and this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@attrs.frozen(kw_only=True)
class Limits:
    """Per-request and per-service bounds (defaults fit a few dozen 1024x1024 images per request)."""

    max_body_bytes: int = 128 << 20
    max_images: int = MAX_IMAGES
    max_clip_frames: int = MAX_CLIP_FRAMES
    max_request_frames: int = MAX_REQUEST_FRAMES
    max_side: int = 4096
    max_pixels: int = 4096 * 4096
    max_request_pixels: int = MAX_REQUEST_PIXELS
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


def shown(value: object, limit: int = 80) -> str:
    """A client's value in a message: escaped (ascii), cut to `limit` characters first, so an 8 MB
    field is neither echoed whole nor escaped whole."""
    if isinstance(value, str) and len(value) > limit:
        return ascii(value[:limit]) + f"... ({len(value)} characters)"
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def library_said(exc: BaseException, limit: int = 200) -> str:
    """A decoding library's message for a client: no object reprs (`<_io.BytesIO object at 0x..>`
    says nothing to the client and leaks an address), escaped, cut short."""
    text = _OBJECT_REPR.sub("the data", str(exc)) or type(exc).__name__
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."


def _field_type(value) -> str:
    return "null" if value is None else type(value).__name__


@attrs.frozen
class Fields:
    """A /score request's fields, checked: the PNGs of its images, or of every clip's frames in order."""

    reward: str
    prompts: list[str]
    encoded: list[str]
    frames: int | None = None  # frames per clip for a clips request; None for images
    actions: np.ndarray | None = None  # float64 [N, rows, width]: each sample's action rows (an action reward's); None without

    def label(self, i: int) -> str:
        """The request's own name of encoded PNG i, for messages: images[3] or clips[1][4]."""
        return f"images[{i}]" if self.frames is None else f"clips[{i // self.frames}][{i % self.frames}]"


def parse_fields(request: object, modalities: Mapping[str, Sequence[str]], limits: Limits,
                 action_rewards: Sequence[str] = ()) -> Fields:  # fmt: skip
    """The fields of a decoded JSON body, or BadRequest naming the field; `modalities` are what each
    reward the service offers takes (`image`: images, `video`: clips), `action_rewards` the rewards
    that also take each sample's action rows (protocol 2's `actions`, which no other reward takes)."""
    fields = _sample_fields(request, modalities, limits)
    rows = _action_rows(request, fields.reward, len(fields.prompts), fields.reward in action_rewards, limits)
    return fields if rows is None else attrs.evolve(fields, actions=rows)


def _action_rows(request: dict, reward: str, count: int, takes: bool, limits: Limits) -> np.ndarray | None:
    """`actions`: one list of rows per prompt, every sample the same row count and every row the same
    width of finite numbers -> float64 [N, rows, width]; required exactly when the reward takes them."""
    if "actions" not in request:
        if takes:
            raise BadRequest(f"reward {reward!r} scores each sample's action rows: send actions, one list of rows (lists of numbers) per prompt")
        return None
    if not takes:
        raise BadRequest(f"reward {reward!r} takes no action rows; remove actions from the request")
    rows = request["actions"]
    if not isinstance(rows, list) or len(rows) != count:
        got = f"{len(rows)} entries" if isinstance(rows, list) else _field_type(rows)
        raise BadRequest(f"actions must be a list of one list of action rows per prompt ({count}), got {got}")
    for i, sample in enumerate(rows):
        if not isinstance(sample, list) or not sample:
            raise BadRequest(f"actions[{i}] must be a non-empty list of action rows, got {_field_type(sample) if not isinstance(sample, list) else 'an empty list'}")
        if len(sample) > limits.max_clip_frames:
            raise BadRequest(f"actions[{i}] has {len(sample)} rows, over the limit of {limits.max_clip_frames}", 413)
        if len(sample) != len(rows[0]):
            raise BadRequest(f"actions[{i}] has {len(sample)} rows but actions[0] has {len(rows[0])}; the samples of one request share a row count")
        for j, row in enumerate(sample):
            width = len(row) if isinstance(row, list) else -1
            if not 1 <= width <= MAX_ACTION_WIDTH or width != (len(rows[0][0]) if isinstance(rows[0][0], list) else -1):
                raise BadRequest(f"actions[{i}][{j}] must be a list of 1 to {MAX_ACTION_WIDTH} numbers, as wide as actions[0][0]")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in row):
                raise BadRequest(f"actions[{i}][{j}] must hold finite numbers, got {shown(row)}")
    return np.asarray(rows, dtype=np.float64)


def _sample_fields(request: object, modalities: Mapping[str, Sequence[str]], limits: Limits) -> Fields:
    """Every field but `actions` (`parse_fields`)."""
    rewards = list(modalities)
    if not isinstance(request, dict):
        raise BadRequest(f"body must be a JSON object with reward, prompts and images (or clips), got {_field_type(request)}")
    missing = [k for k in ("reward", "prompts") if k not in request]
    if "images" not in request and "clips" not in request:
        missing.append("images")
    if missing:
        raise BadRequest(f"missing fields {missing}" + ("; send images, or clips (lists of frames)" if "images" in missing else ""))
    if "images" in request and "clips" in request:
        raise BadRequest("send images or clips in one request, not both")
    reward, prompts = request["reward"], request["prompts"]
    if not isinstance(reward, str):
        raise BadRequest(f"reward must be a string naming one of {sorted(rewards)}, got {_field_type(reward)}")
    if reward not in rewards:
        raise BadRequest(f"unknown reward {shown(reward)}; this service offers {sorted(rewards)}")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise BadRequest("prompts must be a list of strings")
    field, modality = ("clips", "video") if "clips" in request else ("images", "image")
    if modality not in modalities[reward]:
        other = "send each clip's frames as images and reduce their scores (the project's client does)" \
            if field == "clips" else "send clips (a list of frames per sample)"
        raise BadRequest(f"reward {reward!r} does not score {field} (its modalities are {list(modalities[reward])}); {other}")
    if field == "clips":
        return _clip_fields(reward, prompts, request["clips"], limits)
    images = request["images"]
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
    return Fields(reward, prompts, images)


def _clip_fields(reward: str, prompts: list[str], clips: object, limits: Limits) -> Fields:
    """Every clip's length is checked against the limits before any of its frames is looked at."""
    if not isinstance(clips, list):
        raise BadRequest(f"clips must be a list of clips, each a list of base64 PNG frames, got {_field_type(clips)}")
    if not clips:
        raise BadRequest("clips is empty; send at least one clip")
    if len(prompts) != len(clips):
        raise BadRequest(f"got {len(clips)} clips but {len(prompts)} prompts")
    total = 0
    for i, clip in enumerate(clips):
        if not isinstance(clip, list):
            raise BadRequest(f"clips[{i}] must be a list of base64 PNG frames, got {_field_type(clip)}")
        if len(clip) > limits.max_clip_frames:
            raise BadRequest(f"clips[{i}] has {len(clip)} frames, over the limit of {limits.max_clip_frames} frames per clip", 413)
        if not clip:
            raise BadRequest(f"clips[{i}] has no frames; a clip has at least one")
        if len(clip) != len(clips[0]):
            raise BadRequest(f"clips[{i}] has {len(clip)} frames but clips[0] has {len(clips[0])}; the clips of one request share a frame count")
        total += len(clip)
        if total > limits.max_request_frames:
            raise BadRequest(f"clips[0..{i}] hold {total} frames, over the limit of {limits.max_request_frames} per request; split it", 413)
    encoded = []
    for i, clip in enumerate(clips):
        for j, item in enumerate(clip):
            if not isinstance(item, str):
                raise BadRequest(f"clips[{i}][{j}] must be a base64 string, got {_field_type(item)}")
            encoded.append(item)
    return Fields(reward, prompts, encoded, frames=len(clips[0]))


def _image_label(i: int) -> str:
    return f"images[{i}]"


def open_images(
    encoded: Sequence[str], limits: Limits, label: Callable[[int], str] = _image_label, what: str = "images"
) -> list[Image.Image]:
    """Base64 PNGs -> lazily opened images whose headers passed every limit (nothing decoded yet);
    `label(i)` names PNG i in messages, `what` all of them."""
    opened, total, sizes = [], 0, set()
    for i, item in enumerate(encoded):
        try:
            raw = base64.b64decode(item, validate=True)
            image = Image.open(io.BytesIO(raw), formats=["PNG"])  # reads the header only
        except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as exc:
            raise BadRequest(f"{label(i)} is not a base64-encoded PNG: {library_said(exc)}") from None
        except Image.DecompressionBombError as exc:  # pragma: no cover - our limits are lower
            raise BadRequest(f"{label(i)}: {library_said(exc)}", 413) from None
        width, height = image.size
        if max(width, height) > limits.max_side:
            raise BadRequest(f"{label(i)} is {width}x{height}, over the side limit of {limits.max_side}", 413)
        if width * height > limits.max_pixels:
            raise BadRequest(f"{label(i)} has {width * height} pixels, over the limit of {limits.max_pixels}", 413)
        if image.mode != "RGB":
            # Converting RGBA/L here would score something other than what the model made.
            raise BadRequest(f"{label(i)} has mode {shown(image.mode)}; send RGB images")
        total += width * height
        sizes.add((height, width))
        opened.append(image)
    if total > limits.max_request_pixels:
        raise BadRequest(f"the request's {what} hold {total} pixels, over the limit of {limits.max_request_pixels}; split it", 413)
    if len(sizes) != 1:
        raise BadRequest(f"all {what} in one request must share a size, got {sorted(sizes)}")
    return opened


def decoded_bytes(images: Sequence[Image.Image]) -> int:
    """Bytes the opened images take once decoded to uint8 RGB."""
    return sum(im.size[0] * im.size[1] * 3 for im in images)


def decode(images: Sequence[Image.Image], label: Callable[[int], str] = _image_label) -> np.ndarray:
    """Opened (header-checked) images -> uint8 [N, H, W, 3]; a truncated or corrupt one is a 400."""
    height, width = images[0].size[1], images[0].size[0]
    out = np.empty((len(images), height, width, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        try:
            image.load()
            out[i] = np.asarray(image, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as exc:
            raise BadRequest(f"{label(i)} does not decode: {library_said(exc)}") from None
        finally:
            image.close()
    return out


def chunks_within(sizes: Sequence[tuple[int, int, int]], limits: Limits) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive items, each run one request within `limits`; sizes[i] is
    item i's (frames, pixels, encoded bytes), an image being one frame. A run holds at most
    max_images items, max_request_frames frames, max_request_pixels pixels and 7/8 of
    max_body_bytes (the rest is room for the JSON around the PNGs). An item over a limit on its own
    is a run of its own, for the service to refuse with its reason.

    (1, 10, 5) x 5 with max_images 2 -> [(0, 2), (2, 4), (4, 5)].
    """
    caps = (limits.max_images, limits.max_request_frames, limits.max_request_pixels, limits.max_body_bytes - limits.max_body_bytes // 8)
    runs, start, used = [], 0, (0, 0, 0, 0)
    for i, (frames, pixels, size) in enumerate(sizes):
        grown = (used[0] + 1, used[1] + frames, used[2] + pixels, used[3] + size)
        if i > start and any(g > cap for g, cap in zip(grown, caps)):
            runs.append((start, i))
            start, grown = i, (1, frames, pixels, size)
        used = grown
    if sizes:
        runs.append((start, len(sizes)))
    return runs
