"""What an online step draws and rolls out: the prompt rows with their conditioning (`_Batch`) and
each played rank's rollout (`Rollout`). A leaf, shared by the step (trainers/online.py), its reward
tables (online_scoring.py) and one-step-off scoring (async_scoring.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch

# One played rank's rollout: (x0 latents, the sampler's sigmas, uint8 pixels [rows, H, W, 3])
Rollout = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class _Batch(NamedTuple):
    """A step's prompt rows and what its rollout and learn take of them."""

    rows: list[int]
    texts: list[str]
    cursor_before: dict  # the prompt cursor before these rows were drawn
    cond: list[torch.Tensor]
    uncond: list[torch.Tensor]
    condition: torch.Tensor | None
    world: dict  # {"actions": ...} on a world-model run, else empty
