"""Preference pairs listed in a JSONL file, images on the filesystem.

One JSON object per line::

    {"id": "p1", "prompt": "a red square", "winner": "img/p1_w.png", "loser": "img/p1_l.png"}

Optional keys: ``winner_prompt`` / ``loser_prompt`` (checked by ``check_symmetry``).
Other keys are ignored, except tie markers (``"tie": true``, ``"label"`` other than 1),
which are rejected. Image paths are relative to the JSONL file's folder, or absolute.
Blank lines are allowed (they hold no row). The whole file is validated when the
source is built - JSON, fields, unique ids, image files present, winner != loser - and
images are decoded only when a pair is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from cosmos_rl.data.images import ImageSize, as_height_width, load_image
from cosmos_rl.data.pair_record import PreferencePair, PromptSides, parse_pair_metadata
from cosmos_rl.data.textfile import read_lines
from cosmos_rl.errors import UserError


@dataclass(frozen=True)
class _Row:
    line: int
    id: str
    prompt: str
    winner: Path
    loser: Path
    winner_prompt: Optional[str]
    loser_prompt: Optional[str]


def _image_path(row: dict, key: str, folder: Path, origin: str) -> Path:
    if key not in row:
        raise UserError(f"{origin}: missing field {key!r}; every row needs 'winner' and 'loser' image paths")
    value = row[key]
    if not isinstance(value, str) or not value:
        raise UserError(f"{origin}: field {key!r} must be an image path string, found {value!r}")
    image = Path(value)
    image = image if image.is_absolute() else folder / image
    if not image.is_file():
        raise UserError(f"{origin}: {key} image {image} does not exist; fix the path or add the file")
    return image


def _parse_row(text: str, line: int, path: Path) -> _Row:
    origin = f"{path}:{line}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: malformed JSON ({exc.msg} at column {exc.colno}); fix the row") from exc
    pair_id, prompt, winner_prompt, loser_prompt = parse_pair_metadata(row, origin)
    winner = _image_path(row, "winner", path.parent, origin)
    loser = _image_path(row, "loser", path.parent, origin)
    if winner.resolve() == loser.resolve():
        raise UserError(f"{origin}: winner and loser are the same file {winner}; a pair needs two images")
    return _Row(line, pair_id, prompt, winner, loser, winner_prompt, loser_prompt)


class JsonlPairs:
    """Preference pairs from a JSONL file; see the module docstring for the format."""

    def __init__(self, path: Union[str, Path], image_size: ImageSize):
        self.path = Path(path)
        self.image_size = as_height_width(image_size)
        rows: list[_Row] = []
        first_line_of: dict[str, int] = {}
        for line, text in enumerate(read_lines(self.path, "preference JSONL"), start=1):
            if not text.strip():
                continue
            row = _parse_row(text, line, self.path)
            if row.id in first_line_of:
                raise UserError(
                    f"{self.path}:{line}: duplicate id {row.id!r} (first at line "
                    f"{first_line_of[row.id]}); ids must be unique"
                )
            first_line_of[row.id] = line
            rows.append(row)
        if not rows:
            raise UserError(f"{self.path}: no preference rows found; the file is empty")
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
            winner=load_image(row.winner, self.image_size, f"{origin} winner"),
            loser=load_image(row.loser, self.image_size, f"{origin} loser"),
        )

    def membership_ids(self) -> list[str]:
        return [row.id for row in self._rows]

    def prompt_sides(self) -> list[PromptSides]:
        return [
            PromptSides(row.id, f"{self.path}:{row.line}", row.prompt, row.winner_prompt, row.loser_prompt)
            for row in self._rows
        ]
