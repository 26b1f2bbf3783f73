"""UniPC flow sampling with Cosmos3's native classifier-free guidance, for a batch at once.

The sampler is the model's own: a fresh copy of the scheduler the model folder ships
(`scheduler/scheduler_config.json`: solver order, flow shift, ...), with the flow shift replaced
only when the manifest sets `rl.sampler_shift`, and the pipeline's native flow schedule when the
folder's `model_index.json` asks for it. With the same weights and initial noise, a rollout
therefore follows the stock `Cosmos3OmniPipeline` step for step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler

from cosmos_rl.core.flow import model_timesteps
from cosmos_rl.models.actions import hold_rows
from cosmos_rl.models.build import flow_scheduler

if TYPE_CHECKING:
    from cosmos_rl.models.actions import ActionLayout
    from cosmos_rl.models.build import ModelParts

VelocityFn = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor]], torch.Tensor]


def rollout_scheduler(
    steps: int,
    shift: float | None,
    parts: "ModelParts | None" = None,
    device: torch.device | str | None = None,
) -> UniPCMultistepScheduler:
    """A fresh scheduler (UniPC keeps per-trajectory history on the instance) set to `steps`.

    `parts`: the model whose scheduler config (and native-schedule flag) is copied; None means a
    default flow UniPC. `shift`: overrides the config's flow shift; None keeps it (required
    without `parts`).
    """
    if parts is None:
        if shift is None:
            raise ValueError("shift is required when no model parts give the scheduler")
        scheduler, native = flow_scheduler(shift), False
    else:
        overrides = {} if shift is None else {"flow_shift": float(shift)}
        scheduler = UniPCMultistepScheduler.from_config(parts.scheduler.config, **overrides)
        native = parts.native_flow_schedule
    if native:
        # What Cosmos3OmniPipeline does when its config sets use_native_flow_schedule.
        sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, steps + 1)[:-1]
        scheduler.set_timesteps(steps, device=device, sigmas=sigmas)
    else:
        scheduler.set_timesteps(steps, device=device)
    return scheduler


def consistent_sigmas(sigmas: torch.Tensor, timesteps: torch.Tensor, num_train_timesteps: int) -> torch.Tensor:
    """float32 `sigmas` moved by the fewest ulps so that `model_timesteps(sigmas)` equals `timesteps`.

    The scheduler floors N * sigma in float64 but keeps float32 sigmas; where N * sigma lies
    within float32 rounding of an integer (e.g. 999 / 3 steps), flooring the float32 value can
    land one below or above. The forward at a rollout step and every training forward at that
    sigma must both see the scheduler's integer, so the sigma itself is made consistent (it moves
    by ~6e-8, far below anything the noise schedule resolves).
    """
    sigmas = sigmas.to(torch.float32).clone()
    timesteps = timesteps.to(device=sigmas.device, dtype=torch.long)
    for _ in range(8):
        seen = model_timesteps(sigmas, num_train_timesteps)
        if torch.equal(seen, timesteps):
            return sigmas
        toward = torch.where(seen > timesteps, torch.zeros_like(sigmas), torch.full_like(sigmas, 2.0))
        sigmas = torch.where(seen != timesteps, torch.nextafter(sigmas, toward), sigmas)
    raise RuntimeError(f"no float32 sigma floors to the scheduler's timesteps {timesteps.tolist()}")


def _evaluated_sigmas(scheduler: UniPCMultistepScheduler, steps: int, device) -> torch.Tensor:
    """The sigmas [steps] the model is evaluated at, float32, consistent with the scheduler's integers."""
    return consistent_sigmas(scheduler.sigmas[:steps].to(device), scheduler.timesteps, scheduler.config.num_train_timesteps)


def sampler_sigmas(
    steps: int, shift: float | None, parts: "ModelParts | None" = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """The model's own sampler sigmas with the final sigma 0 appended, [steps + 1] float32, for a
    sampler of an algorithm's own (Flow-GRPO's SDE): the sigmas `sample_latents` evaluates the model
    at for the same `steps`, `shift` and `parts`, so a forward at one sees the scheduler's integer."""
    sigmas = _evaluated_sigmas(rollout_scheduler(steps, shift, parts, device=device), steps, device)
    return torch.cat([sigmas, sigmas.new_zeros(1)])


@torch.no_grad()
def sample_latents(
    velocity_fn: VelocityFn,
    noise: torch.Tensor,
    cond_ids: list[torch.Tensor],
    uncond_ids: list[torch.Tensor],
    steps: int,
    shift: float | None,
    guidance: float,
    *,
    parts: "ModelParts | None" = None,
    record: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None,
    actions: torch.Tensor | None = None,
    action_layout: "ActionLayout | None" = None,
    record_actions: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrate from `noise` (sigma = 1) to clean latents; returns (x0 [B, C, T, h, w], sigmas [steps]).

    `velocity_fn(x_t, sigma[B], ids)` is e.g. `functools.partial(velocity, transformer)`.
    `parts` gives the scheduler (see `rollout_scheduler`; `shift` None keeps the model's own).
    Guidance is native: v = v_uncond + guidance * (v_cond - v_uncond); guidance 1 runs the
    conditional branch only, otherwise both branches share one packed forward. The returned sigmas
    are those the model was evaluated at, in order (the final sigma 0 is not one of them); a
    forward at one of them sees the scheduler's integer timestep for that step. `record(index,
    sigma, latents, v)`, when given, sees each step's starting latents and guided velocity.

    `actions` [B, rows, action_dim] (from `models.actions.start_rows`) with their `action_layout`:
    action rows are denoised beside the latents, as the pipeline does it: `velocity_fn(x_t, sigma,
    ids, rows, layout)` returns (v, action v), guidance applies to both, a second scheduler of the
    same settings (the pipeline's copy) steps the rows when some sample generates them, and after
    every step each sample's clean rows are written back and its padding columns zeroed
    (`hold_rows`). The return is then (x0, sigmas, rows [B, rows, action_dim]); `record_actions(index,
    sigma, rows, action v)` sees the rows as `record` sees the latents.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    batch = noise.shape[0]
    if len(cond_ids) != batch or (guidance != 1.0 and len(uncond_ids) != batch):
        raise ValueError(
            f"need one cond (and uncond) prompt per noise sample: {batch} samples, "
            f"{len(cond_ids)} cond, {len(uncond_ids)} uncond"
        )
    if (actions is None) != (action_layout is None):
        raise ValueError("give action rows and their action_layout together")
    if actions is None and record_actions is not None:
        raise ValueError("record_actions needs action rows to record")
    scheduler = rollout_scheduler(steps, shift, parts, device=noise.device)
    sigmas = _evaluated_sigmas(scheduler, steps, noise.device)

    latents = noise.float()
    if actions is not None:
        rows = start = actions.float()
        # The pipeline steps its action rows with a copy of the scheduler (UniPC keeps history).
        action_scheduler = rollout_scheduler(steps, shift, parts, device=noise.device)
    for index, timestep in enumerate(scheduler.timesteps):
        sigma = sigmas[index].expand(batch)
        if guidance == 1.0:
            if actions is None:
                v = velocity_fn(latents, sigma, cond_ids).float()
            else:
                v, v_rows = (out.float() for out in velocity_fn(latents, sigma, cond_ids, rows, action_layout))
        else:
            doubled = (torch.cat([latents, latents]), torch.cat([sigma, sigma]), cond_ids + uncond_ids)
            if actions is None:
                both = velocity_fn(*doubled).float()
            else:
                both, rows_both = velocity_fn(*doubled, torch.cat([rows, rows]), action_layout.twice())
                rows_cond, rows_uncond = rows_both.float().chunk(2)
                v_rows = rows_uncond + guidance * (rows_cond - rows_uncond)
            v_cond, v_uncond = both.float().chunk(2)
            v = v_uncond + guidance * (v_cond - v_uncond)
        if record is not None:
            record(index, sigmas[index], latents, v)
        if record_actions is not None:
            record_actions(index, sigmas[index], rows, v_rows)
        latents = scheduler.step(v, timestep, latents, return_dict=False)[0]
        if actions is not None and action_layout.any_noisy:
            rows = action_scheduler.step(v_rows, timestep, rows, return_dict=False)[0]
            rows = hold_rows(rows, start, action_layout)
    if actions is not None:
        return latents.to(noise.dtype), sigmas, rows.to(actions.dtype)
    return latents.to(noise.dtype), sigmas
