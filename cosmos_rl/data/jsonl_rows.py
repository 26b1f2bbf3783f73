"""Reading the rows of a preference JSONL file, without opening any image; torch-free.

The one parser of the format (see :mod:`cosmos_rl.data.jsonl_pairs`): the run's source stops at
the first problem it returns, ``validate`` lists all of them. Each problem is a ``UserError``
whose message starts with ``file:line``. ``frames`` is the run's frame count (``MediaSpec.frames``):
above 1 the ``winner`` and ``loser`` paths name mp4 clips, at 1 images; a path whose extension says
the other kind is refused here, before anything is opened. The count alone, not the media: ``validate``
reads rows (:mod:`cosmos_rl.data.scan`) even when the manifest's frame size is incomplete.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cosmos_rl.core.files import check_name
from cosmos_rl.data.pair_metadata import parse_pair_metadata
from cosmos_rl.data.textfile import read_lines
from cosmos_rl.core.errors import UserError


@dataclass(frozen=True)
class PairRow:
    line: int
    id: str
    prompt: str
    winner: Path
    loser: Path
    winner_prompt: Optional[str]
    loser_prompt: Optional[str]


# What a side's extension says it is; anything else is left to the decoder to judge.
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
_CLIP_SUFFIXES = (".mp4",)


def _kind_problem(path: Path, key: str, frames: int) -> Optional[str]:
    suffix = path.suffix.lower()
    if frames > 1 and suffix in _IMAGE_SUFFIXES:
        return (f"{key} {path} is an image, but clips of {frames} frames are expected (model.num_frames); "
                f"name an mp4 clip (or set model.num_frames = 1)")
    if frames == 1 and suffix in _CLIP_SUFFIXES:
        return (f"{key} {path} is a clip, but this run trains images (model.num_frames = 1); name an image, "
                "or set model.num_frames to the clips' frame count")
    return None


def _image_path(row: dict, key: str, folder: Path, origin: str, frames: int) -> tuple[Path, os.stat_result]:
    what = "a clip (mp4)" if frames > 1 else "an image"
    if key not in row:
        raise UserError(f"{origin}: missing field {key!r}; every row needs 'winner' and 'loser' paths ({what} each)")
    value = row[key]
    if not isinstance(value, str) or not value:
        raise UserError(f"{origin}: field {key!r} must be {what} path string, found {value!r}")
    image = check_name(value, f"{origin}: {key}", "clip" if frames > 1 else "image")  # os.stat raises on a NUL
    image = image if image.is_absolute() else folder / image
    problem = _kind_problem(image, key, frames)
    if problem is not None:
        raise UserError(f"{origin}: {problem}")
    try:
        found = os.stat(image)
    except OSError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode):
        raise UserError(f"{origin}: {key} {'clip' if frames > 1 else 'image'} {image} does not exist; fix the path or add the file")
    return image, found


def parse_row(text: str, line: int, path: Path, frames: int) -> PairRow:
    origin = f"{path}:{line}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: malformed JSON ({exc.msg} at column {exc.colno}); fix the row") from exc
    except RecursionError:
        raise UserError(f"{origin}: JSON nested too deeply to read; fix the row") from None
    pair_id, prompt, winner_prompt, loser_prompt = parse_pair_metadata(row, origin)
    winner, winner_stat = _image_path(row, "winner", path.parent, origin, frames)
    loser, loser_stat = _image_path(row, "loser", path.parent, origin, frames)
    # One stat per image (no path resolution) keeps a million-row file cheap; same inode = same file.
    if os.path.samestat(winner_stat, loser_stat):
        raise UserError(f"{origin}: winner and loser are the same file {winner}; a pair needs two {'clips' if frames > 1 else 'images'}")
    return PairRow(line, pair_id, prompt, winner, loser, winner_prompt, loser_prompt)


def read_pair_rows(path: Path, frames: int) -> tuple[list[PairRow], list[UserError]]:
    """Every good row in file order, and every problem (bad rows, duplicate ids, an empty file).

    A file that cannot be read at all is raised, not returned: there are no rows to go on with.
    """
    rows: list[PairRow] = []
    problems: list[UserError] = []
    first_line_of: dict[str, int] = {}
    for line, text in enumerate(read_lines(path, "preference JSONL"), start=1):
        if not text.strip():
            continue
        try:
            row = parse_row(text, line, path, frames)
        except UserError as exc:
            problems.append(exc)
            continue
        if row.id in first_line_of:
            problems.append(UserError(
                f"{path}:{line}: duplicate id {row.id!r} (first at line {first_line_of[row.id]}); ids must be unique"
            ))
            continue
        first_line_of[row.id] = line
        rows.append(row)
    if not rows and not problems:
        problems.append(UserError(f"{path}: no preference rows found; the file is empty"))
    return rows, problems
