"""Reading a user's line-oriented text file (JSONL pairs, prompt lists) with errors that name it."""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.core.files import MAX_TEXT_BYTES, read_user_text


def read_lines(path: Path, what: str) -> list[str]:
    """The file's lines; `what` names the file in errors (e.g. "preference JSONL", "prompt file").
    Opened by `core.files` (a regular file of at most MAX_TEXT_BYTES, a name without NUL bytes)."""
    return read_user_text(path, "", what, MAX_TEXT_BYTES).splitlines()
