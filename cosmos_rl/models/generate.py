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
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.core.seeds import derive_seed

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
    condition: torch.Tensor | None = None,
    record: StepRecord | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample a batch: returns (latents [B, C, T, h, w] in `noise`'s dtype, uint8 pixels): images
    [B, H, W, 3] for one frame, clips [B, F, H, W, 3] for video.

    - `parts.transformer` predicts the velocity (whichever adapter is active is the one sampled);
      `parts.scheduler`'s config gives the sampler, with `settings.shift` replacing its flow shift
      when set, and `parts.native_flow_schedule` (when the parts have it) the pipeline's schedule.
    - `media`: what each sample is (frames, size, fps); `noise` [B, C, T, h, w] must match it. A
      clip's latent frames sit at the pipeline's fps-modulated time positions.
    - `prompt_ids`: (cond, uncond) token ids, one 1-D tensor per sample each (uncond is unused at
      guidance 1); `settings`: steps, shift, guidance (native: v_uncond + g * (v_cond - v_uncond)).
    - `noise`: the latents at sigma 1 (see `noise()`); each caller's batch composition and order is
      kept as given (packed batches match single samples only to about 1e-5).
    - `condition`: clean latents [B, C, k, h, w] of the first k latent frames, held as the pipeline
      holds them: written over the noise's first k frames, given no timestep, never predicted
      (velocity 0), so the sampler keeps them (the latents returned hold them exactly).
      Image-to-video is k = 1, the latent of the first frame (`condition_latents`); the
      pipeline's video-to-video is larger k.
    - `record`: called after every sampler step (see `StepRecord`), e.g. for the sigmas a rollout
      trains at or an SDE algorithm's per-step log-probabilities.
    """
    from cosmos_rl.core.media import frame_timing
    from cosmos_rl.models.packing import velocity
    from cosmos_rl.models.sampling import sample_latents

    if noise.dim() != 5:
        raise ValueError(f"noise must be [B, C, T, h, w] for {media}, got {tuple(noise.shape)}")
    transformer = parts.transformer
    cond, uncond = prompt_ids
    timing = frame_timing(media, parts.vae.config)
    clean_frames = 0
    start = noise
    if condition is not None:
        if condition.dim() != 5 or condition.shape[:2] != noise.shape[:2] or condition.shape[3:] != noise.shape[3:]:
            raise ValueError(f"condition must be [B, C, k, h, w] like noise {tuple(noise.shape)}, got {tuple(condition.shape)}")
        clean_frames = int(condition.shape[2])
        start = noise.clone()
        start[:, :, :clean_frames] = condition.to(noise.dtype)
    latents, _ = sample_latents(
        lambda x, sigma, ids: velocity(transformer, x, sigma, ids, clean_frames=clean_frames, **timing),
        start, cond, uncond, settings.steps, settings.shift, settings.guidance, parts=parts, record=record,
    )
    if clean_frames:
        # Velocity 0 keeps them only up to the multistep update's rounding (~1e-6): written back, so
        # the latents returned (an I2V rollout's x0, which NFT trains on) hold the condition itself.
        latents[:, :, :clean_frames] = start[:, :, :clean_frames]
    return latents, decode_pixels(parts.vae, media, latents)


@torch.no_grad()
def decode_pixels(vae: torch.nn.Module, media: MediaSpec, latents: torch.Tensor) -> torch.Tensor:
    """Clean latents [B, C, T, h, w] -> uint8 pixels as `generate` returns them: images [B, H, W, 3]
    for one frame, clips [B, F, H, W, 3] for video (a sampler of an algorithm's own decodes here too)."""
    from cosmos_rl.data.pixels import to_uint8
    from cosmos_rl.models.vae import decode_clips, decode_latents

    if not media.is_video:
        images = decode_latents(vae, latents)
        return torch.from_numpy(to_uint8(images.permute(0, 2, 3, 1).float().cpu().numpy()))
    clips = decode_clips(vae, latents)  # [B, 3, F, H, W]
    return torch.from_numpy(to_uint8(clips.permute(0, 2, 3, 4, 1).float().cpu().numpy()))


def encode_pixels(vae: torch.nn.Module, media: MediaSpec, pixels: torch.Tensor) -> torch.Tensor:
    """Float pixels in [0, 1] of `media` samples -> normalised latents [B, C, T, h, w] (the VAE's
    posterior mean): images [B, 3, H, W] for one frame, clips [B, 3, F, H, W] for video. The one
    encode entry, beside `decode_pixels`: every trainer, the latent cache and the base builds call
    it, so what a sample is decides how it is encoded in one place."""
    from cosmos_rl.models.vae import encode_clips, encode_images

    # A one-frame sample may come as an image [B, 3, H, W] or as a clip of one frame [B, 3, 1, H, W]
    # (the latent cache keeps the two apart); either way the VAE sees the same one frame.
    clip = pixels.dim() == 5
    expected = (3, media.frames, *media.size) if clip else (3, *media.size)
    if tuple(pixels.shape[1:]) != expected or (not clip and media.is_video):
        raise ValueError(f"pixels of {media} must be [B, {', '.join(map(str, (3, media.frames, *media.size) if media.is_video else expected))}], got {tuple(pixels.shape)}")
    return encode_clips(vae, pixels) if clip else encode_images(vae, pixels)


@torch.no_grad()
def condition_latents(vae: torch.nn.Module, given: torch.Tensor) -> torch.Tensor:
    """A condition's given frames, uint8 -> the clean latents a generation holds [B, C, k', h, w].

    - First frames [B, H, W, 3] (image to video) -> [B, C, 1, h, w]. The pipeline's `image=` path
      encodes a clip of copies of the image and keeps latent frame 0. The Wan encoder is causal in
      time and reads frame 0 alone, so that latent is the latent of the image by itself, which is
      what this encodes (pixels scaled as the pipeline scales them).
    - Leading frames [B, k, H, W, 3] (k = 4j + 1, a clip continued) -> the encoder's latent frames
      of those k frames, which (causal again) are the first latent frames of the whole clip's."""
    if given.dtype != torch.uint8 or given.shape[-1] != 3 or given.dim() not in (4, 5):
        raise ValueError(f"given frames must be uint8 [B, H, W, 3] or [B, k, H, W, 3], got {given.dtype} {tuple(given.shape)}")
    from cosmos_rl.models.vae import as_clip, normalised_latents

    if given.dim() == 4:
        pixels = as_clip(given.permute(0, 3, 1, 2).to(torch.float32) / 127.5 - 1.0)  # [B, 3, 1, H, W]
    else:
        pixels = given.permute(0, 4, 1, 2, 3).to(torch.float32) / 127.5 - 1.0  # [B, 3, k, H, W]
    return normalised_latents(vae, pixels.to(next(vae.parameters()).dtype)).float()
