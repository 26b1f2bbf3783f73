"""Rendered moving-shapes clips written as the project's clip shards (for supervised fine-tuning).

Clip ``i`` of a set is rendered with :func:`cosmos_rl.shapes.shards.sample_seed` (as image sample
``i`` is) and written by :func:`cosmos_rl.data.clip_shards.write_clip_shards` (mp4, caption,
``{"task"}``) into ``motion-*.tar``. Its own module, not in :mod:`cosmos_rl.shapes.shards`, so
that importing :mod:`cosmos_rl.shapes` does not import the video codec (PyAV).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Union

from cosmos_rl.data.clip_shards import ClipRecord, write_clip_shards
from cosmos_rl.shapes.clips import render_clip
from cosmos_rl.shapes.motion_spec import MotionSpec
from cosmos_rl.shapes.scene import ImageSize
from cosmos_rl.shapes.shards import sample_seed


def write_motion_shards(out_dir: Union[str, Path], specs: Sequence[MotionSpec], seed: int, size: ImageSize, frames: int,
                        fps: float, per_shard: int = 1000) -> list[Path]:  # fmt: skip
    """Render one clip per video spec, in order, into ``motion-*.tar`` shards under ``out_dir``
    (each clip rendered only as it is written); returns the shard paths."""
    records = (
        ClipRecord(render_clip(spec, sample_seed(seed, index), size, frames), spec.caption(), {"task": spec.task})
        for index, spec in enumerate(specs)
    )
    return write_clip_shards(out_dir, records, fps, per_shard, prefix="motion")
