"""Reading a prompt file for online NFT; torch-free, so `validate` reads it with the run's parser.

A ``.txt`` file holds one prompt per line (blank lines hold no prompt; surrounding whitespace is
stripped); a ``.jsonl`` file one ``{"prompt": ...}`` object per line (other keys ignored; blank
lines allowed). Any other suffix is rejected so that a file is never parsed the wrong way.

A JSONL row may also name an ``"image"``: the path of an image-to-video run's conditioning first
frame (`model.condition.source = "image"`), relative to the prompt file's folder when not absolute.
`read_prompt_rows` returns it with the row's line; `read_prompts` keeps the prompts alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple, Optional, Union

from cosmos_rl.core.files import check_name
from cosmos_rl.data.textfile import read_lines
from cosmos_rl.core.errors import UserError


class PromptRow(NamedTuple):
    """One prompt of a file: its text, its conditioning image (JSONL `image`, resolved) and its 1-based line."""

    prompt: str
    image: Optional[Path]
    line: int


def _jsonl_row(text: str, origin: str, folder: Path) -> tuple[str, Optional[Path]]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: malformed JSON ({exc.msg} at column {exc.colno}); fix the row") from exc
    except RecursionError:
        raise UserError(f"{origin}: JSON nested too deeply to read; fix the row") from None
    if not isinstance(row, dict) or "prompt" not in row:
        raise UserError(f'{origin}: expected an object with a "prompt" field, found {text.strip()[:80]!r}')
    prompt = row["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f'{origin}: "prompt" must be a non-empty string, found {prompt!r}')
    image = row.get("image")
    if image is None:
        return prompt, None
    if not isinstance(image, str) or not image.strip():
        raise UserError(f'{origin}: "image" must be a non-empty path string, found {image!r}; name the conditioning frame\'s file')
    return prompt, folder / check_name(image, f'{origin}: "image"', "conditioning image")  # an absolute `image` stays as it is


def read_prompts(path: Union[str, Path]) -> tuple[list[str], list[UserError]]:
    """Every prompt in file order and every bad row; a file that cannot be read at all is raised."""
    rows, problems = read_prompt_rows(path)
    return [row.prompt for row in rows], problems


def read_prompt_rows(path: Union[str, Path]) -> tuple[list[PromptRow], list[UserError]]:
    """`read_prompts` with each good row's image and line."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise UserError(f"{path}: prompt files must end in .txt (one per line) or .jsonl, got {suffix!r}")
    prompts: list[PromptRow] = []
    problems: list[UserError] = []
    for line, text in enumerate(read_lines(path, "prompt file"), start=1):
        if not text.strip():
            continue
        if suffix == ".txt":
            prompts.append(PromptRow(text.strip(), None, line))
            continue
        try:
            prompts.append(PromptRow(*_jsonl_row(text, f"{path}:{line}", path.parent), line))
        except UserError as exc:
            problems.append(exc)
    if not prompts and not problems:
        problems.append(UserError(f"{path}: no prompts found; the file is empty"))
    return prompts, problems


def load_prompts(path: Union[str, Path]) -> list[str]:
    """All prompts in file order, or the first problem raised."""
    prompts, problems = read_prompts(path)
    if problems:
        raise problems[0]
    return prompts
