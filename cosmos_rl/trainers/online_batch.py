"""What an online step draws and rolls out: the prompt rows with their conditioning (`_Batch`) and
each played rank's rollout (`Rollout`). A leaf, shared by the step (trainers/online.py), its reward
tables (online_scoring.py) and one-step-off scoring (async_scoring.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch

# One played rank's rollout: (x0 latents, the sampler's sigmas, uint8 pixels [rows, H, W, 3])
Rollout = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class ActionRollout(tuple):
    """A policy-mode rollout (the world model generating its actions): the same 3-tuple as `Rollout`
    (so every consumer unpacks it alike), plus `.actions`, the generated action rows the sampler
    returned ([rows, chunk, action_dim], the model's normalised rows, padding columns zero), which
    the chunk reward executes and NFT's action loss trains on."""

    actions: torch.Tensor

    def __new__(cls, x0: torch.Tensor, sigmas: torch.Tensor, pixels: torch.Tensor, actions: torch.Tensor) -> "ActionRollout":
        rollout = super().__new__(cls, (x0, sigmas, pixels))
        rollout.actions = actions
        return rollout


class _Batch(NamedTuple):
    """A step's prompt rows and what its rollout and learn take of them."""

    rows: list[int]
    texts: list[str]
    cursor_before: dict  # the prompt cursor before these rows were drawn
    cond: list[torch.Tensor]
    uncond: list[torch.Tensor]
    condition: torch.Tensor | None
    world: dict  # {"actions": ...} on a world-model run, else empty
