"""Mined preference pairs as webdataset tar shards that `rl.data.shards` reads.

Pair `i` is three members sharing the key `%08d` % i: `<key>.json` (`id`, `prompt`, the two
scores and how they were made), `<key>.winner.png` and `<key>.loser.png`. Shards are named
`pairs-%06d.tar`, `per_shard` pairs each, written with fixed member metadata (data.tar_write).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cosmos_rl.data.tar_write import add_member, png_bytes, refuse_existing, shard

PREFIX = "pairs"


class PairShardWriter:
    """Collects pairs and writes a shard every `per_shard` of them; `close` writes the rest."""

    def __init__(self, out_dir: Path, per_shard: int):
        if per_shard < 1:
            raise ValueError(f"per_shard must be >= 1, got {per_shard}")
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
                add_member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode("utf-8"))
                add_member(tar, f"{key}.winner.png", png_bytes(winner))
                add_member(tar, f"{key}.loser.png", png_bytes(loser))
                self.count += 1
        self._pending = []
        self.paths.append(path)
