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

from typing import TYPE_CHECKING, Callable, Protocol

import torch

from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.core.seeds import derive_seed

if TYPE_CHECKING:
    from cosmos_rl.models.actions import ActionLayout

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
    actions: torch.Tensor | None = None,
    action_layout: "ActionLayout | None" = None,
    record_actions: StepRecord | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    - `actions`: the action rows [B, rows, action_dim] a world-model sample starts from
      (`models.actions.start_rows`: clean rows given, noisy rows noise, padding columns zero) with
      their `action_layout`, denoised beside the latents as the pipeline's action modes do
      (`sampling.sample_latents`); the return is then (latents, pixels, rows [B, rows, action_dim]),
      the clean rows exactly as given. With every latent frame a condition (inverse dynamics) only
      the rows are generated. `record_actions` sees the rows' steps as `record` sees the latents'.
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
    if actions is None:
        if action_layout is not None or record_actions is not None:
            raise ValueError("an action layout or record_actions needs the action rows (actions=)")
        latents, _ = sample_latents(
            lambda x, sigma, ids: velocity(transformer, x, sigma, ids, clean_frames=clean_frames, **timing),
            start, cond, uncond, settings.steps, settings.shift, settings.guidance, parts=parts, record=record,
        )  # fmt: skip
    else:
        if action_layout is None:
            raise ValueError("action rows need their action_layout (models.actions.ActionLayout)")
        action_layout.check(transformer.config, actions)
        _check_padding(actions, action_layout)
        latents, _, rows = sample_latents(
            lambda x, sigma, ids, a, layout: velocity(
                transformer, x, sigma, ids, clean_frames=clean_frames, actions=a, action_layout=layout, **timing
            ),
            start, cond, uncond, settings.steps, settings.shift, settings.guidance, parts=parts, record=record,
            actions=actions, action_layout=action_layout, record_actions=record_actions,
        )  # fmt: skip
    if clean_frames:
        # Velocity 0 keeps them only up to the multistep update's rounding (~1e-6): written back, so
        # the latents returned (an I2V rollout's x0, which NFT trains on) hold the condition itself.
        latents[:, :, :clean_frames] = start[:, :, :clean_frames]
    pixels = decode_pixels(parts.vae, media, latents)
    return (latents, pixels) if actions is None else (latents, pixels, rows)


def _check_padding(rows: torch.Tensor, layout: "ActionLayout") -> None:
    # The pipeline's rows are zero past the embodiment's width from the start; a nonzero one would
    # enter the first forward (later steps zero it), so it is refused, not repaired.
    for index, width in enumerate(layout.widths):
        if rows[index, :, width:].any():
            raise ValueError(
                f"action rows of sample {index} are nonzero past its width {width}: build them with models.actions.start_rows"
            )


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


@torch.no_grad()
def clip_condition_latents(vae: torch.nn.Module, clips: torch.Tensor, latent_frames: int) -> torch.Tensor:
    """World-model conditions (video-to-video, the action modes): uint8 clips [B, F, H, W, 3] -> the
    clean latents [B, C, k, h, w] of their first k = `latent_frames` latent frames (k = 1: frame 0,
    as forward dynamics and policy hold it; every latent frame: inverse dynamics).

    The pipeline's `video=` and `action=` paths encode a whole clip (its tail repeat-padded with the
    last conditioning frame) and keep the leading latent frames. The Wan encoder is causal in time
    (frame 0 alone, then chunks of 4 frames), so those latents are the latents of the clip's first
    4 (k - 1) + 1 frames by themselves, which is what this encodes, one clip at a time (as the
    pipeline does: a batched convolution rounds differently, by up to 4e-7) and with the pipeline's
    own arithmetic (pixels / 255 * 2 - 1, then (latent - mean) * (1 / std)), so the latents are
    the pipeline's to the bit. (`condition_latents`, image-to-video, encodes a batch and divides by
    std: within a few ulps of the pipeline.)"""
    if clips.dim() != 5 or clips.shape[-1] != 3 or clips.dtype != torch.uint8:
        raise ValueError(f"clips must be uint8 [B, F, H, W, 3], got {clips.dtype} {tuple(clips.shape)}")
    from cosmos_rl.core.media import is_wan_frame_count, vae_temporal_factor

    frames = (latent_frames - 1) * vae_temporal_factor(vae.config) + 1
    if latent_frames < 1 or clips.shape[1] < frames:
        raise ValueError(f"{latent_frames} latent frames need the clip's first {frames} frames, the clips have {clips.shape[1]}")
    if not is_wan_frame_count(frames):
        # The encoder reads whole chunks of 4 frames: a chunk that straddles the conditioning
        # frames would mix in the pipeline's padding frames.
        raise ValueError(f"{latent_frames} latent frames span {frames} frames, not the 4k + 1 the Wan encoder reads whole")
    dtype = next(vae.parameters()).dtype
    # VideoProcessor: float32 pixels / 255, then 2 x - 1; [B, 3, F, H, W].
    pixels = (clips[:, :frames].to(torch.float32) / 255.0 * 2.0 - 1.0).permute(0, 4, 1, 2, 3)
    raw = torch.cat([vae.encode(clip[None].to(dtype)).latent_dist.mode() for clip in pixels])
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, dtype=dtype, device=raw.device).view(shape)
    inverse_std = (1.0 / torch.tensor(vae.config.latents_std, dtype=dtype)).to(raw.device).view(shape)
    return ((raw - mean) * inverse_std).float()
