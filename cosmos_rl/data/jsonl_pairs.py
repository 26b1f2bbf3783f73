"""Preference pairs listed in a JSONL file, images on the filesystem.

One JSON object per line::

    {"id": "p1", "prompt": "a red square", "winner": "img/p1_w.png", "loser": "img/p1_l.png"}

Optional keys: ``winner_prompt`` / ``loser_prompt`` (checked by ``check_symmetry``).
Other keys are ignored, except tie markers (``"tie": true``, ``"label"`` other than 1),
which are rejected. Image paths are relative to the JSONL file's folder, or absolute.
Blank lines are allowed (they hold no row). The whole file is validated when the
source is built - JSON, fields, unique ids, image files present, winner != loser (rows are
read by :mod:`cosmos_rl.data.jsonl_rows`) - and images are decoded only when a pair is read.

Clips: with ``media.frames`` > 1 (a video run) ``winner`` and ``loser`` name mp4 files, each decoded to
[3, F, H, W] by :mod:`cosmos_rl.data.clips` (exactly F frames of the run's size, never resized or cut).
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from cosmos_rl.data.clips import load_clip
from cosmos_rl.data.images import load_image
from cosmos_rl.data.jsonl_rows import read_pair_rows
from cosmos_rl.data.pair_record import PreferencePair, PromptSides
from cosmos_rl.core.media import MediaSpec


class JsonlPairs:
    """Preference pairs from a JSONL file, each side of `media`; see the module docstring for the format."""

    def __init__(self, path: Union[str, Path], media: MediaSpec):
        self.path = Path(path)
        self.media = media
        rows, problems = read_pair_rows(self.path, media.frames)
        if problems:
            raise problems[0]
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> PreferencePair:
        if not 0 <= index < len(self._rows):
            raise IndexError(f"pair index {index} out of range [0, {len(self._rows)})")
        row = self._rows[index]
        origin = f"{self.path}:{row.line} (id {row.id!r})"
        return PreferencePair(
            id=row.id,
            prompt=row.prompt,
            winner=self._load(row.winner, f"{origin} winner"),
            loser=self._load(row.loser, f"{origin} loser"),
        )

    def _load(self, path: Path, origin: str):
        if self.media.is_video:
            return load_clip(path, self.media.frames, *self.media.size, origin)
        return load_image(path, self.media.size, origin)

    def membership_ids(self) -> list[str]:
        return [row.id for row in self._rows]

    def prompt_sides(self) -> list[PromptSides]:
        return [
            PromptSides(row.id, f"{self.path}:{row.line}", row.prompt, row.winner_prompt, row.loser_prompt)
            for row in self._rows
        ]
