"""Prompts for online NFT: loading a prompt file and the resumable prompt cursor.

``load_prompts`` reads either a ``.txt`` file (one prompt per line; blank lines hold no
prompt; surrounding whitespace is stripped) or a ``.jsonl`` file (one ``{"prompt": ...}``
object per line; other keys ignored; blank lines allowed). Any other suffix is
rejected so that a file is never parsed the wrong way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence, Union

from cosmos_rl.data.cursor import ShuffledStream
from cosmos_rl.data.textfile import read_lines
from cosmos_rl.data.vocab import COLOUR_RGB, SHAPES
from cosmos_rl.errors import UserError

# Colour words a colour/brightness reward can respond to; for smoke runs without a file.
BUILTIN_PROMPTS: tuple[str, ...] = tuple(
    f"a {colour} {shape}" for colour in COLOUR_RGB for shape in SHAPES[:2]
)


def _jsonl_prompt(text: str, origin: str) -> str:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: malformed JSON ({exc.msg} at column {exc.colno}); fix the row") from exc
    if not isinstance(row, dict) or "prompt" not in row:
        raise UserError(f'{origin}: expected an object with a "prompt" field, found {text.strip()[:80]!r}')
    prompt = row["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f'{origin}: "prompt" must be a non-empty string, found {prompt!r}')
    return prompt


def load_prompts(path: Union[str, Path]) -> list[str]:
    """All prompts in file order; see the module docstring for the formats."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise UserError(f"{path}: prompt files must end in .txt (one per line) or .jsonl, got {suffix!r}")
    prompts = []
    for line, text in enumerate(read_lines(path, "prompt file"), start=1):
        if not text.strip():
            continue
        prompts.append(_jsonl_prompt(text, f"{path}:{line}") if suffix == ".jsonl" else text.strip())
    if not prompts:
        raise UserError(f"{path}: no prompts found; the file is empty")
    return prompts


class PromptCursor:
    """Which prompt rows NFT samples at each step; every rank sees the same rows.

    Same stream as :class:`cosmos_rl.data.cursor.PairCursor` (epoch-shuffled with
    ``seed + epoch``, nothing dropped); its state is the NFT "prompt cursor".
    """

    def __init__(self, num_prompts: int, prompts_per_step: int, seed: int, shuffle: bool = True):
        self._stream = ShuffledStream(num_prompts, prompts_per_step, seed, shuffle)

    @property
    def step(self) -> int:
        return self._stream.step

    def next_batch(self, prompts: Sequence[str]) -> list[tuple[int, str]]:
        """``(row_index, prompt)`` for the next step; ``prompts`` is the list the cursor walks."""
        if len(prompts) != self._stream.size:
            raise ValueError(f"cursor walks {self._stream.size} prompts, got a list of {len(prompts)}")
        return [(row, prompts[row]) for row in self._stream.take()]

    def state_dict(self) -> dict[str, int]:
        return self._stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state, "prompt cursor")
