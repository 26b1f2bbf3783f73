"""Reading a user's line-oriented text file (JSONL pairs, prompt lists) with errors that name it."""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.core.errors import UserError


def read_lines(path: Path, what: str) -> list[str]:
    """The file's lines; `what` names the file in errors (e.g. "preference JSONL", "prompt file")."""
    if not path.is_file():
        raise UserError(f"{path}: {what} not found; check the path in the manifest")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc}); save the {what} as UTF-8") from exc
