"""Mined preference pairs as webdataset tar shards that `rl.data.shards` reads.

Pair `i` is three members sharing the key `%08d` % i: `<key>.json` (`id`, `prompt`, the two
scores and how they were made), `<key>.winner.png` and `<key>.loser.png`; pairs of clips
(uint8 [F, H, W, 3]) are `<key>.winner.mp4` and `<key>.loser.mp4` instead, encoded losslessly at
the writer's `fps` (`data.clip_files.encode_clip`), the layout a video DPO run reads; their json then
records both members' SHA-256 (`"sha256": {"winner.mp4": ..., "loser.mp4": ...}`), which the
readers verify (`data.member_checksums`): H.264 has no checksum of its own. Shards are
named `pairs-%06d.tar`, `per_shard` pairs each, written with fixed member metadata (data.tar_write).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cosmos_rl.data.clip_files import encode_clip
from cosmos_rl.data.member_checksums import FIELD, digest
from cosmos_rl.data.tar_write import add_member, png_bytes, refuse_existing, shard

PREFIX = "pairs"
SUMMARY_FILE = "mine.json"  # what a mining command writes beside the shards (mining.command, mining.world)


class PairShardWriter:
    """Collects pairs and writes a shard every `per_shard` of them; `close` writes the rest. `fps`
    is the frame rate clips are written at (images need none)."""

    def __init__(self, out_dir: Path, per_shard: int, fps: float | None = None):
        if per_shard < 1:
            raise ValueError(f"per_shard must be >= 1, got {per_shard}")
        self.fps = fps
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        refuse_existing(self.out, PREFIX)
        self.per_shard = per_shard
        self.paths: list[Path] = []
        self.count = 0
        self._pending: list[tuple[dict, np.ndarray, np.ndarray]] = []

    def add(self, meta: dict, winner: np.ndarray, loser: np.ndarray) -> None:
        self._pending.append((meta, winner, loser))
        if len(self._pending) == self.per_shard:
            self._flush()

    def close(self) -> list[Path]:
        if self._pending:
            self._flush()
        return self.paths

    def _flush(self) -> None:
        path = self.out / f"{PREFIX}-{len(self.paths):06d}.tar"
        with shard(path) as tar:
            for meta, winner, loser in self._pending:
                key = f"{self.count:08d}"
                sides = {f"{side}.{self._suffix(pixels)}": self._encoded(pixels) for side, pixels in (("winner", winner), ("loser", loser))}
                clips = {ext: digest(data) for ext, data in sides.items() if ext.endswith(".mp4")}  # PNG checks its own chunks
                if clips:
                    meta = {**meta, FIELD: clips}
                add_member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode("utf-8"))
                for ext, data in sides.items():
                    add_member(tar, f"{key}.{ext}", data)
                self.count += 1
        self._pending = []
        self.paths.append(path)

    def _suffix(self, pixels: np.ndarray) -> str:
        return "mp4" if pixels.ndim == 4 else "png"

    def _encoded(self, pixels: np.ndarray) -> bytes:
        if pixels.ndim == 3:
            return png_bytes(pixels)
        if self.fps is None:
            raise ValueError("a clip pair needs the writer's fps")
        return encode_clip(pixels, self.fps)
