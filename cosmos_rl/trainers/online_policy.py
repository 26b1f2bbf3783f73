"""Policy mode of an online world-model run (NFT, `docs/world_policy.md`): each rollout is given a
window's frame 0 and generates the frames AND the action rows. What the step needs beyond forward
dynamics: the action rows' seeded initial noise (`rollout_action_noise`) and the executed part of a
generated chunk in the embodiment's own units, which the chunk reward steps in the simulator
(`executed_actions`).
"""

from __future__ import annotations

import numpy as np
import torch

from cosmos_rl.core import schema
from cosmos_rl.core.actions import ActionSpec


def rollout_action_noise(rl: schema.OnlineRLBase, job_seed: int, rank: int, step: int, chunk: int, action_dim: int,
                         device: torch.device) -> torch.Tensor:  # fmt: skip
    """Rank `rank`'s initial action rows [rows, chunk, action_dim] for the rows of `step` (1-based): on
    the same clock as the latents' noise (`online.rollout_noise`), from streams of their own, so
    the latents' draws are those of a forward-dynamics run (the padding columns are zeroed later,
    `models.actions.start_rows`)."""
    from cosmos_rl.models.generate import noise

    rows = rl.prompts_per_step
    if rl.rollout_seed_clock == "source_row":
        first = (step - 1) * rows
        return torch.cat([
            noise((1, chunk, action_dim), job_seed, "rollout-action-row", rank, first + j, device=device, draw_on="device")
            for j in range(rows)
        ])
    return noise((rows, chunk, action_dim), job_seed, "rollout-action-step", rank, step, device=device, draw_on="device")


def executed_actions(spec: ActionSpec, rows: torch.Tensor, execute: int) -> np.ndarray:
    """float64 [B, n, width]: the leading `n` of each sample's generated model rows [B, chunk,
    action_dim], de-normalised into the embodiment's units (`raw = row * scale + offset`); n is
    `execute`, or the whole chunk for 0 (`[model.action] execute`)."""
    from cosmos_rl.models.actions import raw_actions

    chunk = int(rows.shape[1])
    if not 0 <= execute <= chunk:
        raise ValueError(f"execute must be in [0, {chunk}] (0: the whole chunk), got {execute}")
    n = execute or chunk
    return raw_actions(spec, rows[:, :n].detach().to("cpu", torch.float64)).numpy()
