"""Reading a prompt file for online NFT; torch-free, so `validate` reads it with the run's parser.

A ``.txt`` file holds one prompt per line (blank lines hold no prompt; surrounding whitespace is
stripped); a ``.jsonl`` file one ``{"prompt": ...}`` object per line (other keys ignored; blank
lines allowed). Any other suffix is rejected so that a file is never parsed the wrong way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from cosmos_rl.data.textfile import read_lines
from cosmos_rl.errors import UserError


def _jsonl_prompt(text: str, origin: str) -> str:
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
    return prompt


def read_prompts(path: Union[str, Path]) -> tuple[list[str], list[UserError]]:
    """Every prompt in file order and every bad row; a file that cannot be read at all is raised."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise UserError(f"{path}: prompt files must end in .txt (one per line) or .jsonl, got {suffix!r}")
    prompts: list[str] = []
    problems: list[UserError] = []
    for line, text in enumerate(read_lines(path, "prompt file"), start=1):
        if not text.strip():
            continue
        if suffix == ".txt":
            prompts.append(text.strip())
            continue
        try:
            prompts.append(_jsonl_prompt(text, f"{path}:{line}"))
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
