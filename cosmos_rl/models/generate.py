"""The project's one way to generate samples from a model, and its one labelled noise source.

`generate` is the documented entry point for sampling a model (the NFT rollout, `cosmos-rl eval`,
`[rl.eval]` and `pairs mine` all call it): initial noise -> the model's own UniPC scheduler with
native classifier-free guidance, every sample of a batch in one packed forward per sampler step
(`models/packing.velocity`) -> clean latents -> the VAE -> uint8 pixels (`data/pixels.to_uint8`).
With the same weights and noise it follows the stock `Cosmos3OmniPipeline` step for step.

`noise(shape, *labels)` draws a sample's initial latents from a generator seeded by a hash of its
labels (`seeds.derive_seed`), so a sample's noise depends on what it is (a rollout's seed, rank
and row; an evaluation's seed and caption), never on the batch it lands in.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.models.media import MediaSpec
from cosmos_rl.seeds import derive_seed

# record(index, sigma, latents, velocity): after the sampler's step `index` at noise level `sigma`
# ([] float32), with the latents the step started from and the guided velocity it applied.
StepRecord = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


class GeneratingParts(Protocol):
    transformer: torch.nn.Module  # the network that predicts the velocity (policy, base, old adapter...)
    vae: torch.nn.Module
    scheduler: object  # the model folder's scheduler; its config is copied for every call


def noise(shape: tuple[int, ...], *labels, device: torch.device | str = "cpu", draw_on: str = "cpu") -> torch.Tensor:
    """Standard normal latents of `shape` from a generator seeded by `labels`.

    `draw_on`: "cpu" draws on the CPU and moves the result to `device` (the same numbers on every
    device: evaluations, mining, the shapes scorer); "device" draws on `device` itself (rollouts,
    whose noise never leaves its rank)."""
    where = device if draw_on == "device" else "cpu"
    generator = torch.Generator(device=where).manual_seed(derive_seed(*labels))
    return torch.randn(shape, generator=generator, device=where).to(device)


@torch.no_grad()
def generate(
    parts: GeneratingParts,
    media: MediaSpec,
    prompt_ids: tuple[list[torch.Tensor], list[torch.Tensor]],
    noise: torch.Tensor,
    settings: SamplerSettings,
    *,
    condition=None,
    record: StepRecord | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample a batch: returns (latents [B, C, T, h, w] in `noise`'s dtype, uint8 pixels [B, H, W, 3]).

    - `parts.transformer` predicts the velocity (whichever adapter is active is the one sampled);
      `parts.scheduler`'s config gives the sampler, with `settings.shift` replacing its flow shift
      when set, and `parts.native_flow_schedule` (when the parts have it) the pipeline's schedule.
    - `media`: what each sample is (frames, size); `noise` [B, C, T, h, w] must match it.
    - `prompt_ids`: (cond, uncond) token ids, one 1-D tensor per sample each (uncond is unused at
      guidance 1); `settings`: steps, shift, guidance (native: v_uncond + g * (v_cond - v_uncond)).
    - `noise`: the latents at sigma 1 (see `noise()`); each caller's batch composition and order is
      kept as given (packed batches match single samples only to about 1e-5).
    - `record`: called after every sampler step (see `StepRecord`), e.g. for the sigmas a rollout
      trains at or an SDE algorithm's per-step log-probabilities.
    - `condition`: clean latent frames held fixed (image-to-video); not supported yet.
    """
    from cosmos_rl.data.pixels import to_uint8
    from cosmos_rl.models.packing import velocity
    from cosmos_rl.models.sampling import sample_latents
    from cosmos_rl.models.vae import decode_latents

    if condition is not None:
        raise NotImplementedError("conditioning frames (image-to-video) are not supported yet")
    if noise.dim() != 5:
        raise ValueError(f"noise must be [B, C, T, h, w] for {media}, got {tuple(noise.shape)}")
    transformer = parts.transformer
    cond, uncond = prompt_ids
    latents, _ = sample_latents(
        lambda x, sigma, ids: velocity(transformer, x, sigma, ids),
        noise, cond, uncond, settings.steps, settings.shift, settings.guidance, parts=parts, record=record,
    )
    images = decode_latents(parts.vae, latents)
    return latents, torch.from_numpy(to_uint8(images.permute(0, 2, 3, 1).float().cpu().numpy()))
