"""Writing clip-caption webdataset shards: what a world generator calls; torch-free.

Sample ``i`` of a set is three tar members sharing the key ``%08d`` % i: ``<key>.mp4`` (the frames,
encoded by :func:`cosmos_rl.data.clip_files.encode_clip`: lossless H.264), ``<key>.txt`` (the
caption, UTF-8) and ``<key>.json`` (the sample's metadata with ``caption`` and ``sha256``: ``{"mp4":
<the mp4 member's SHA-256>}``, which the readers verify (:mod:`cosmos_rl.data.member_checksums`);
sorted keys). Shards are
``<prefix>-%06d.tar``, ``per_shard`` samples each, written by :mod:`cosmos_rl.data.tar_write` (fixed
member metadata, renamed once complete), so the same samples write byte-identical files for one
PyAV build. :class:`cosmos_rl.data.captions.CaptionShards` reads them back with ``frames`` = F.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Union

import numpy as np

from cosmos_rl.data.clip_files import encode_clip
from cosmos_rl.data.member_checksums import FIELD, digest
from cosmos_rl.data.tar_write import add_member, refuse_existing, shard
from cosmos_rl.core.errors import UserError


@dataclass(frozen=True)
class ClipRecord:
    frames: np.ndarray  # uint8 [F, H, W, 3]
    caption: str
    meta: dict = field(default_factory=dict)  # more json fields (task, spec, seed, ...); "caption" and "sha256" are set


def write_clip_shards(
    out_dir: Union[str, Path], records: Iterable[ClipRecord], fps: float, per_shard: int = 1000, prefix: str = "clips"
) -> list[Path]:
    """Write ``records`` in order into shards under ``out_dir``; returns the shard paths.

    Refuses a folder that already holds ``<prefix>-*.tar`` (a reader globbing it would mix the sets).
    """
    if per_shard <= 0:
        raise UserError(f"per_shard must be positive, got {per_shard}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    refuse_existing(out, prefix)
    paths: list[Path] = []
    pending = iter(records)
    index = 0
    record = next(pending, None)
    if record is None:
        raise UserError("no clips to write; pass at least one")
    while record is not None:
        path = out / f"{prefix}-{len(paths):06d}.tar"
        with shard(path) as tar:
            for _ in range(per_shard):
                key = f"{index:08d}"
                clip = encode_clip(record.frames, fps)
                meta = {**record.meta, "caption": record.caption, FIELD: {"mp4": digest(clip)}}
                add_member(tar, f"{key}.mp4", clip)
                add_member(tar, f"{key}.txt", record.caption.encode("utf-8"))
                add_member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode("utf-8"))
                index += 1
                record = next(pending, None)
                if record is None:
                    break
        paths.append(path)
    return paths
