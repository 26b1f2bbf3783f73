"""Preference pairs stored in webdataset-style tar shards.

A sample is the run of consecutive members sharing a key, split the webdataset way
(``dir/abc.winner.png`` -> key ``dir/abc``, extension ``winner.png``; the key ends at the
file name's first dot). Each sample needs:

- ``json``: ``{"id": ..., "prompt": ...}`` plus optional ``winner_prompt`` /
  ``loser_prompt``; tie markers are rejected as in the JSONL format;
- exactly one ``winner.<ext>`` and one ``loser.<ext>``, ``<ext>`` one of
  ``png``, ``jpg``, ``jpeg``, ``webp``; in a video run (``media.frames`` > 1) ``winner.mp4`` and
  ``loser.mp4``, each decoded to [3, F, H, W] by :mod:`cosmos_rl.data.clips` (exactly F frames of
  the run's size, never resized or cut).

Other members (``txt``, ``cls``, ...) are ignored. Shards are given as paths, a list of
paths, or a webdataset brace pattern (``shards/pairs-{000..009}.tar``). Pairs are read
by index in any order, so shards must be local, uncompressed ``.tar`` files: at
construction each shard's member table and ``json`` members are read once by
:mod:`cosmos_rl.data.tar_index` (no image bytes are read or decoded; a shard cut short is
refused); a pair's image bytes are then read at the recorded offsets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, Union

from cosmos_rl.data.clips import decode_clip
from cosmos_rl.data.images import decode_image
from cosmos_rl.data.pair_record import PreferencePair, PromptSides
from cosmos_rl.data.tar_index import IMAGE_EXTENSIONS, Blob, TarSample, index_shards, read_blob, shard_paths
from cosmos_rl.core.media import MediaSpec

__all__ = ["IMAGE_EXTENSIONS", "TarShardPairs"]


class TarShardPairs:
    """Preference pairs from webdataset tar shards, each side of `media`; see the module docstring for the layout."""

    def __init__(self, urls_or_paths: Union[str, Path, Sequence[Union[str, Path]]], media: MediaSpec):
        self.media = media
        self.shards = shard_paths(urls_or_paths)
        samples, problems = index_shards(self.shards, media.frames)
        if problems:
            raise problems[0]
        self._samples = samples

    def __len__(self) -> int:
        return len(self._samples)

    def _read(self, sample: TarSample, blob: Blob, side: str):
        origin = f"{sample.origin} (id {sample.id!r}) {side}"
        data = read_blob(sample, blob, origin)
        if self.media.is_video:
            return decode_clip(data, self.media.frames, *self.media.size, origin)
        return decode_image(data, self.media.size, origin)

    def __getitem__(self, index: int) -> PreferencePair:
        if not 0 <= index < len(self._samples):
            raise IndexError(f"pair index {index} out of range [0, {len(self._samples)})")
        sample = self._samples[index]
        return PreferencePair(
            id=sample.id,
            prompt=sample.prompt,
            winner=self._read(sample, sample.winner, "winner"),
            loser=self._read(sample, sample.loser, "loser"),
        )

    def membership_ids(self) -> list[str]:
        return [sample.id for sample in self._samples]

    def prompt_sides(self) -> list[PromptSides]:
        return [
            PromptSides(s.id, s.origin, s.prompt, s.winner_prompt, s.loser_prompt) for s in self._samples
        ]
