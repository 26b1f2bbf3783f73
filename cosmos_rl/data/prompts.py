"""Prompts for online NFT: the built-in list, loading a prompt file, and the resumable prompt cursor.

``load_prompts`` (from :mod:`cosmos_rl.data.prompt_file`, which documents the ``.txt`` and
``.jsonl`` formats) returns every prompt of a file or raises its first bad row.
"""

from __future__ import annotations

from typing import Any, Sequence

from cosmos_rl.data.cursor import ShuffledStream
from cosmos_rl.data.prompt_file import load_prompts
from cosmos_rl.data.vocab import COLOUR_RGB, SHAPES

__all__ = ["BUILTIN_PROMPTS", "PromptCursor", "load_prompts", "run_prompts"]

# Colour words a colour/brightness reward can respond to; for smoke runs without a file.
BUILTIN_PROMPTS: tuple[str, ...] = tuple(
    f"a {colour} {shape}" for colour in COLOUR_RGB for shape in SHAPES[:2]
)


def run_prompts(rl) -> list[str]:
    """The prompts an online run walks: its `rl.prompts.file`, else the built-in list."""
    return load_prompts(rl.prompts.file) if rl.prompts.file else list(BUILTIN_PROMPTS)


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
