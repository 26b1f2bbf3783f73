"""The preference-pair record, the source protocol, and checks shared by all sources."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, runtime_checkable

import torch

from cosmos_rl.core.errors import UserError


@dataclass(frozen=True)
class PreferencePair:
    """One preference: ``winner`` was preferred over ``loser`` for ``prompt``.

    Images are float tensors [3, H, W] in [0, 1], already at the run's image size; in a video run
    (``model.num_frames`` = F > 1) both sides are clips [3, F, H, W] of the run's frames and size.
    """

    id: str
    prompt: str
    winner: torch.Tensor
    loser: torch.Tensor


@runtime_checkable
class PairSource(Protocol):
    """What the DPO trainer needs from a source of preference pairs."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> PreferencePair: ...

    def membership_ids(self) -> list[str]:
        """Every pair id, in index order, from metadata only (never decodes images)."""
        ...


@dataclass(frozen=True)
class PromptSides:
    """The prompts a row states for each side; ``None`` means "same as ``prompt``"."""

    id: str
    origin: str  # "file:line" or "shard sample 'key'", for error messages
    prompt: str
    winner_prompt: Optional[str]
    loser_prompt: Optional[str]


def _token_list(tokens: Any) -> list:
    return tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)


def check_symmetry(rows: Iterable[PromptSides], tokenize_fn: Callable[[str], Sequence[int]]) -> int:
    """Fail on the first row whose sides were not generated from the trained prompt.

    The trainer conditions both sides on ``prompt``; a row that states per-side prompts
    must have each of them tokenize exactly like ``prompt`` (compared as token ids, so
    whitespace or casing differences the tokenizer ignores are fine). Rows without
    per-side prompts share one prompt by construction and are not tokenized.
    Returns the number of rows compared.
    """
    checked = 0
    for row in rows:
        if row.winner_prompt is None and row.loser_prompt is None:
            continue
        reference = _token_list(tokenize_fn(row.prompt))
        for side, text in (("winner_prompt", row.winner_prompt), ("loser_prompt", row.loser_prompt)):
            if text is None:
                continue
            if _token_list(tokenize_fn(text)) != reference:
                raise UserError(
                    f"{row.origin} (id {row.id!r}): {side} {text!r} does not tokenize like prompt "
                    f"{row.prompt!r}; winner and loser must come from the same prompt - fix or "
                    "remove this row"
                )
        checked += 1
    return checked


def check_source_symmetry(source: Any, tokenize_fn: Callable[[str], Sequence[int]]) -> int:
    """:func:`check_symmetry` over a source's ``prompt_sides()``.

    Sources without ``prompt_sides`` yield a single prompt per pair, so there is nothing
    that could disagree; they return 0.
    """
    sides = getattr(source, "prompt_sides", None)
    if sides is None:
        return 0
    return check_symmetry(sides(), tokenize_fn)


def _layout_problem(image: Any, frames: int) -> Optional[str]:
    """Why `image` is not a side of a run of `frames` frames: [3, H, W] at 1, [3, frames, H, W] above."""
    want = "[3, H, W] tensor" if frames == 1 else f"[3, F = {frames}, H, W] clip tensor (model.num_frames)"
    if not isinstance(image, torch.Tensor):
        return f"must be a {want}, got {type(image).__name__}"
    dims = 3 if frames == 1 else 4
    if image.dim() != dims or image.shape[0] != 3 or (frames > 1 and image.shape[1] != frames):
        return f"must be a {want}, got {tuple(image.shape)}"
    return None


def check_pair(pair: Any, origin: str, frames: int) -> PreferencePair:
    """Check that a record from an untrusted source has the documented shape and range: images at
    `frames` = 1, clips of exactly `frames` frames above."""
    if not isinstance(pair, PreferencePair):
        raise UserError(f"{origin}: expected a PreferencePair, got {type(pair).__name__}")
    for side in ("winner", "loser"):
        image = getattr(pair, side)
        problem = _layout_problem(image, frames)
        if problem is not None:
            raise UserError(f"{origin} (id {pair.id!r}): {side} {problem}")
        if not image.is_floating_point():
            raise UserError(f"{origin} (id {pair.id!r}): {side} must be float in [0, 1], got {image.dtype}")
        low, high = float(image.min()), float(image.max())
        if low < 0.0 or high > 1.0:
            raise UserError(
                f"{origin} (id {pair.id!r}): {side} values span [{low:.3g}, {high:.3g}], expected [0, 1]"
            )
    if pair.winner.shape != pair.loser.shape:
        raise UserError(
            f"{origin} (id {pair.id!r}): winner {tuple(pair.winner.shape)} and loser "
            f"{tuple(pair.loser.shape)} differ in size"
        )
    return pair
