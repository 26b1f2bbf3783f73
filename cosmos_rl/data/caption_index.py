"""Reading image-caption and clip-caption metadata (shards and JSONL) without opening any image or
clip; torch-free.

The one reader of the layouts :mod:`cosmos_rl.data.captions` documents: the run's source stops at
the first problem these return, ``validate`` lists all of them. ``frames`` is the run's frame count
(``MediaSpec.frames``): at 1 a sample's media is its image (or, with no image, a one-frame clip),
above 1 it must be a clip. These read metadata only, so they take the count alone: ``validate``
reads them (:mod:`cosmos_rl.data.scan`) even when the manifest's frame size is incomplete.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

from cosmos_rl.core.files import check_name
from cosmos_rl.data.member_checksums import recorded
from cosmos_rl.data.tar_index import CLIP_EXTENSIONS, IMAGE_EXTENSIONS, Blob, index_members, metadata_member, side_blob
from cosmos_rl.data.textfile import read_lines
from cosmos_rl.core.errors import UserError


@dataclass(frozen=True)
class ShardEntry:
    shard: Path
    key: str
    id: str
    caption: str
    image: Blob  # the media member: an image, or a clip when kind is "clip"
    kind: str = "image"

    @property
    def origin(self) -> str:
        return f"{self.shard} sample {self.key!r}"


@dataclass(frozen=True)
class CaptionRow:
    line: int
    id: str
    caption: str
    image: Path  # the media file: an image, or a clip when kind is "clip"
    kind: str = "image"


def _text(value, origin: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{origin}: {what} must be a non-empty string, found {value!r}; give every sample a caption")
    return value.strip()


def _caption_of(row: dict, origin: str) -> str:
    key = "caption" if "caption" in row else "prompt"
    if key not in row:
        raise UserError(f"{origin}: no 'caption' (or 'prompt') field; every sample needs a caption")
    return _text(row[key], origin, f"field {key!r}")


def _clips_expected(origin: str, frames: int, where: str) -> UserError:
    return UserError(f"{origin}: an image, but clips of {frames} frames are expected (model.num_frames); {where}")


def _media_member(members: dict, origin: str, frames: int, checksums: dict) -> tuple[str, Blob]:
    """(kind, bytes) of the sample's image or clip member, by the rule of the module docstring, with
    the digest its json's ``sha256`` records (``checksums``), verified when it is read."""
    has_image = any(ext in members for ext in IMAGE_EXTENSIONS)
    has_clip = any(ext in members for ext in CLIP_EXTENSIONS)
    if frames > 1 and has_image and not has_clip:
        raise _clips_expected(origin, frames, "give every sample one mp4 clip member")
    if frames > 1 or (has_clip and not has_image):
        return "clip", side_blob(members, "", origin, CLIP_EXTENSIONS, "clip", checksums)
    return "image", side_blob(members, "", origin, checksums=checksums)


def _shard_entry(archive: tarfile.TarFile, key: str, members: dict, shard: Path, frames: int) -> ShardEntry:
    origin = f"{shard} sample {key!r}"
    row: dict = {}
    if "json" in members:
        try:
            row = json.loads(metadata_member(archive, members["json"], origin))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise UserError(f"{origin}: json member is not valid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise UserError(f"{origin}: json member holds a {type(row).__name__}, not an object")
    if "txt" in members:
        try:
            caption = _text(metadata_member(archive, members["txt"], origin).decode("utf-8"), origin, "the txt member")
        except UnicodeDecodeError as exc:
            raise UserError(f"{origin}: txt member is not UTF-8 ({exc})") from exc
    elif row:
        caption = _caption_of(row, origin)
    else:
        raise UserError(f"{origin}: no caption: give it a 'txt' member or a 'json' member with 'caption' (members: {', '.join(sorted(members))})")
    kind, media = _media_member(members, origin, frames, recorded(row, members, origin))
    return ShardEntry(shard, key, str(row.get("id", f"{shard.name}/{key}")), caption, media, kind)


def index_caption_shards(shards: Sequence[Path], frames: int) -> tuple[list[ShardEntry], list[UserError]]:
    """Every shard's good samples in order (ids unique across shards) and every problem found."""
    entries: list[ShardEntry] = []
    problems: list[UserError] = []
    seen: dict[str, str] = {}
    for shard in shards:
        found, bad = index_members(shard, partial(_shard_entry, frames=frames))
        problems += bad
        for entry in found:
            if entry.id in seen:
                problems.append(UserError(f"{entry.origin}: duplicate id {entry.id!r} (first in {seen[entry.id]}); ids must be unique"))
                continue
            seen[entry.id] = entry.origin
            entries.append(entry)
    if not entries and not problems:
        problems.append(UserError(f"{', '.join(map(str, shards))}: the shards hold no samples"))
    return entries, problems


def _media_file(row: dict, origin: str, frames: int) -> tuple[str, str]:
    """(kind, field) of the row's media: "image" unless the run wants clips or the row has only a "video"."""
    if frames > 1:
        if "video" not in row and "image" in row:
            raise _clips_expected(origin, frames, "give every row a 'video' field naming an mp4 clip")
        return "clip", "video"
    return ("clip", "video") if "video" in row and "image" not in row else ("image", "image")


def _row(text: str, line: int, path: Path, frames: int) -> CaptionRow:
    origin = f"{path}:{line}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: malformed JSON ({exc.msg} at column {exc.colno}); fix the row") from exc
    except RecursionError:
        raise UserError(f"{origin}: JSON nested too deeply to read; fix the row") from None
    if not isinstance(row, dict):
        raise UserError(f"{origin}: a row must be a JSON object, found {type(row).__name__}")
    kind, field = _media_file(row, origin, frames)
    what = "an image" if kind == "image" else "a clip (mp4)"
    media = row.get(field)
    if not isinstance(media, str) or not media:
        raise UserError(f"{origin}: field {field!r} must be {what} path string, found {media!r}")
    media = check_name(media, f"{origin}: {field}", kind)  # is_file would call it missing
    media_path = media if media.is_absolute() else path.parent / media
    if not media_path.is_file():
        raise UserError(f"{origin}: {kind} {media_path} does not exist; fix the path or add the file")
    return CaptionRow(line, str(row.get("id", line)), _caption_of(row, origin), media_path, kind)


def read_caption_rows(path: Path, frames: int) -> tuple[list[CaptionRow], list[UserError]]:
    """Every good row in file order and every problem (bad rows, duplicate ids, an empty file)."""
    rows: list[CaptionRow] = []
    problems: list[UserError] = []
    first: dict[str, int] = {}
    for line, text in enumerate(read_lines(Path(path), "image-caption JSONL"), start=1):
        if not text.strip():
            continue
        try:
            row = _row(text, line, Path(path), frames)
        except UserError as exc:
            problems.append(exc)
            continue
        if row.id in first:
            problems.append(UserError(f"{path}:{line}: duplicate id {row.id!r} (first at line {first[row.id]}); ids must be unique"))
            continue
        first[row.id] = line
        rows.append(row)
    if not rows and not problems:
        problems.append(UserError(f"{path}: no image-caption rows found; the file is empty"))
    return rows, problems
