"""UniPC flow sampling with Cosmos3's native classifier-free guidance, for a batch at once."""

from __future__ import annotations

from typing import Callable

import torch

from cosmos_rl.models.build import flow_scheduler

VelocityFn = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor]], torch.Tensor]


@torch.no_grad()
def sample_latents(
    velocity_fn: VelocityFn,
    noise: torch.Tensor,
    cond_ids: list[torch.Tensor],
    uncond_ids: list[torch.Tensor],
    steps: int,
    shift: float,
    guidance: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integrate from `noise` (sigma = 1) to clean latents; returns (x0 [B, C, h, w], sigmas [steps]).

    `velocity_fn(x_t, sigma[B], ids)` is e.g. `functools.partial(velocity, transformer)`.
    Guidance is native: v = v_uncond + guidance * (v_cond - v_uncond); guidance 1 runs the
    conditional branch only, otherwise both branches share one packed forward. The returned sigmas
    are those the model was evaluated at, in order (the final sigma 0 is not one of them).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    batch = noise.shape[0]
    if len(cond_ids) != batch or (guidance != 1.0 and len(uncond_ids) != batch):
        raise ValueError(
            f"need one cond (and uncond) prompt per noise sample: {batch} samples, "
            f"{len(cond_ids)} cond, {len(uncond_ids)} uncond"
        )
    # A fresh scheduler per call: UniPC keeps per-trajectory history on the instance.
    scheduler = flow_scheduler(shift)
    scheduler.set_timesteps(steps, device=noise.device)
    sigmas = scheduler.sigmas[:steps].to(device=noise.device, dtype=torch.float32)

    latents = noise.float()
    for index, timestep in enumerate(scheduler.timesteps):
        sigma = sigmas[index].expand(batch)
        if guidance == 1.0:
            v = velocity_fn(latents, sigma, cond_ids).float()
        else:
            both = velocity_fn(torch.cat([latents, latents]), torch.cat([sigma, sigma]), cond_ids + uncond_ids)
            v_cond, v_uncond = both.float().chunk(2)
            v = v_uncond + guidance * (v_cond - v_uncond)
        latents = scheduler.step(v, timestep, latents, return_dict=False)[0]
    return latents.to(noise.dtype), sigmas
