"""Image-caption and clip-caption samples for SFT: webdataset tar shards or a JSONL file.

Shards (``rl.data.shards``; the layout ``python -m cosmos_rl.shapes shards`` writes): a sample is
the run of members sharing a key (split as in :mod:`cosmos_rl.data.tar_index`) with exactly one
image member (``png``, ``jpg``, ``jpeg`` or ``webp``) and a caption, taken from the ``txt``
member (UTF-8) or else from the ``json`` member's ``caption`` (or ``prompt``) field. The id is the
json ``id`` when given, else ``<shard file name>/<key>``. Other members are ignored.

JSONL (``rl.data.jsonl``): one object per line, ``{"image": path, "caption": text}`` (``prompt``
is read when ``caption`` is absent; optional ``id``, default the line number). Image paths are
relative to the file's folder. Blank lines hold no row.

Every source reads samples of one ``media`` (:class:`~cosmos_rl.core.media.MediaSpec`: the run's
frames and frame size). Clips: with ``media.frames`` > 1 (a video run) the media is an ``mp4`` member
in place of the image, or a ``"video"`` field in place of ``"image"``, and a sample is [3, F, H, W].
At ``media.frames`` = 1 a sample with an mp4 and no image is a one-frame clip, read as an image
[3, H, W]. Clips are decoded and checked by :mod:`cosmos_rl.data.clip_files` (exact frame count and
size, never resized).

Metadata is read by :mod:`cosmos_rl.data.caption_index` when the source is built (the first
problem stops it); images are decoded only
when a sample is read, with the resize rule of :mod:`cosmos_rl.data.images`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import torch

from cosmos_rl.data.caption_index import index_caption_shards, read_caption_rows
from cosmos_rl.data.clips import decode_clip, load_clip
from cosmos_rl.data.images import decode_image, load_image
from cosmos_rl.data.tar_index import read_blob, shard_paths
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec


@dataclass(frozen=True)
class CaptionSample:
    id: str
    caption: str
    image: torch.Tensor  # [3, H, W] in [0, 1]; a clip (media.frames > 1): [3, F, H, W]
    actions: torch.Tensor | None = None  # an episode window's raw actions [F - 1, width] (data/episode_windows.py)


def _as_sample(clip: torch.Tensor) -> torch.Tensor:
    """A decoded clip [3, F, H, W] as a sample: a one-frame clip is an image [3, H, W]."""
    return clip[:, 0] if clip.shape[1] == 1 else clip


class CaptionShards:
    """Image-caption samples from webdataset tar shards (see the module docstring)."""

    def __init__(self, urls_or_paths: Union[str, Path, Sequence[Union[str, Path]]], media: MediaSpec):
        self.media = media
        self.shards = shard_paths(urls_or_paths)
        self._entries, problems = index_caption_shards(self.shards, media.frames)
        if problems:
            raise problems[0]

    def __len__(self) -> int:
        return len(self._entries)

    def caption(self, index: int) -> str:
        return self._entries[index].caption

    def __getitem__(self, index: int) -> CaptionSample:
        entry = self._entries[index]
        data = read_blob(entry, entry.image, entry.origin)  # type: ignore[arg-type]
        if entry.kind == "clip":
            return CaptionSample(entry.id, entry.caption, _as_sample(decode_clip(data, self.media.frames, *self.media.size, entry.origin)))
        return CaptionSample(entry.id, entry.caption, decode_image(data, self.media.size, entry.origin))


class CaptionJsonl:
    """Image-caption samples listed in a JSONL file (see the module docstring)."""

    def __init__(self, path: Union[str, Path], media: MediaSpec):
        self.path = Path(path)
        self.media = media
        self._rows, problems = read_caption_rows(self.path, media.frames)
        if problems:
            raise problems[0]

    def __len__(self) -> int:
        return len(self._rows)

    def caption(self, index: int) -> str:
        return self._rows[index].caption

    def __getitem__(self, index: int) -> CaptionSample:
        row = self._rows[index]
        origin = f"{self.path}:{row.line} (id {row.id!r})"
        if row.kind == "clip":
            return CaptionSample(row.id, row.caption, _as_sample(load_clip(row.image, self.media.frames, *self.media.size, origin)))
        return CaptionSample(row.id, row.caption, load_image(row.image, self.media.size, origin))


def caption_source(shards: Sequence[str], jsonl: str, media: MediaSpec) -> Union[CaptionShards, CaptionJsonl]:
    """The source `rl.data` names (preflight allows exactly one), its samples of `media` (clips when
    `media.frames` > 1)."""
    if shards:
        return CaptionShards(list(shards), media)
    if jsonl:
        return CaptionJsonl(jsonl, media)
    raise UserError("rl.data: no image-caption source; set rl.data.shards or rl.data.jsonl")
