"""Shapes prompts written as prompt files the project reads (``cosmos_rl.data.prompts.load_prompts``).

- ``.txt``: one caption per line;
- ``.jsonl``: one ``{"prompt": caption, "task": ..., "spec": {...}}`` object per line (the
  loader reads ``prompt`` and ignores the rest; ``task`` and ``spec`` are for people and tools).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Union

from cosmos_rl.core.errors import UserError
from cosmos_rl.shapes.caption import parse_caption
from cosmos_rl.shapes.spec import Spec


def prompt_file_kind(path: Union[str, Path], prompts: Sequence) -> str:
    """".txt" or ".jsonl" for a prompt file about to be written, or a UserError naming `path`."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise UserError(f"{path}: prompt files must end in .txt (one per line) or .jsonl, got {suffix!r}")
    if not prompts:
        raise UserError(f"{path}: no prompts to write")
    return suffix


def replace_lines(path: Union[str, Path], lines: Sequence[str]) -> Path:
    """Write `lines` to `path` through a `.partial` file, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def write_spec_file(path: Union[str, Path], prompts: Sequence, kind: type, parse: Callable[[str], Any],
                    row: Callable[[Any], dict]) -> Path:  # fmt: skip
    """Write ``prompts`` (specs of type ``kind``, or captions ``parse`` reads, in order) to ``path``,
    replacing it: a ``.txt`` line is the caption, a ``.jsonl`` row is ``row(spec)`` (either world's)."""
    suffix = prompt_file_kind(path, prompts)
    specs = [p if isinstance(p, kind) else parse(p) for p in prompts]
    if suffix == ".txt":
        return replace_lines(path, [spec.caption() for spec in specs])
    return replace_lines(path, [json.dumps(row(spec)) for spec in specs])


def write_prompt_file(path: Union[str, Path], prompts: Sequence[Union[Spec, str]]) -> Path:
    """Write ``prompts`` (specs or captions of the world, in order) to ``path``, replacing it."""
    return write_spec_file(path, prompts, Spec, parse_caption,
                           lambda s: {"prompt": s.caption(), "task": s.task, "spec": s.to_dict()})  # fmt: skip
