"""Rendered shapes samples written as webdataset tar shards (for supervised fine-tuning).

Sample ``i`` of a set is three tar members sharing the key ``%08d`` % i:

- ``<key>.png``: the rendered RGB image;
- ``<key>.txt``: its caption (UTF-8, no newline);
- ``<key>.json``: ``{"caption", "task", "spec", "seed", "size": [h, w]}``, where ``seed`` is the
  render seed, so ``render(Spec.from_dict(spec), seed, size)`` gives the image back.

Shards are plain uncompressed tars named ``<prefix>-%06d.tar``, ``per_shard`` samples each, with
fixed member metadata (mtime 0, owner 0), so the same arguments write byte-identical files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Union

import numpy as np

from cosmos_rl.data.tar_write import add_member, png_bytes, refuse_existing, shard
from cosmos_rl.core.errors import UserError
from cosmos_rl.shapes.scene import ImageSize, height_width, render
from cosmos_rl.shapes.spec import Spec


def sample_seed(seed: int, index: int) -> int:
    """The render seed of sample ``index`` in a set written with ``seed`` (a 32-bit integer)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def write_shards(
    out_dir: Union[str, Path],
    specs: Sequence[Spec],
    seed: int,
    size: ImageSize = 32,
    per_shard: int = 1000,
    prefix: str = "shapes",
) -> list[Path]:
    """Render one sample per spec (in order) into shards under ``out_dir``; returns the shard paths.

    Refuses a folder that already holds ``<prefix>-*.tar`` files: a reader globbing the folder
    would mix the old set into the new one.
    """
    if per_shard <= 0:
        raise UserError(f"per_shard must be positive, got {per_shard}")
    if not specs:
        raise UserError("no specs to write; pass at least one")
    height, width = height_width(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    refuse_existing(out, prefix)
    paths = []
    for first in range(0, len(specs), per_shard):
        path = out / f"{prefix}-{first // per_shard:06d}.tar"
        with shard(path) as tar:
            for index in range(first, min(first + per_shard, len(specs))):
                spec, key, image_seed = specs[index], f"{index:08d}", sample_seed(seed, index)
                meta = {"caption": spec.caption(), "task": spec.task, "spec": spec.to_dict(),
                        "seed": image_seed, "size": [height, width]}
                add_member(tar, f"{key}.png", png_bytes(render(spec, image_seed, (height, width))))
                add_member(tar, f"{key}.txt", spec.caption().encode("utf-8"))
                add_member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode("utf-8"))
        paths.append(path)
    return paths
