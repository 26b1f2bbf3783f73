"""Pixels <-> normalised latents with the Wan VAE, which works on videos ([B, C, T, H, W]).

Latents are [B, C, T, h, w] everywhere in the project (T = 1 for an image). Images are
[B, 3, H, W]: this module is where an image gains and loses its one-frame time axis. Clips are
[B, 3, F, H, W] (`encode_clips` / `decode_clips`); the encoder reads frame 0 alone and then chunks
of exactly 4 frames, so F is 4k + 1 (`models.media.latent_frames`).
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLWan


def _latent_stats(vae: AutoencoderKLWan, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=like.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=like.dtype).view(shape)
    return mean, std


def _check_images(images: torch.Tensor) -> None:
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must have shape [B, 3, H, W], got {tuple(images.shape)}")


def as_clip(images: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] images -> one-frame clips [B, 3, 1, H, W] (the time axis the Wan VAE takes)."""
    _check_images(images)
    return images.unsqueeze(2)  # [B, 3, T=1, H, W]


def encode_images(vae: AutoencoderKLWan, images: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> normalised latents [B, C, 1, h, w] (posterior mean, so deterministic)."""
    return encode_clips(vae, as_clip(images))


def decode_latents(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents of single frames [B, C, 1, h, w] -> images [B, 3, H, W] in [0, 1]."""
    if latents.dim() != 5 or latents.shape[2] != 1:
        raise ValueError(f"latents must have shape [B, C, T=1, h, w], got {tuple(latents.shape)}")
    return decode_clips(vae, latents).squeeze(2)


def raw_latents(vae: AutoencoderKLWan, images: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> the encoder's posterior mean [B, C, 1, h, w] before normalisation
    (what the latent statistics `latents_mean` / `latents_std` are measured on)."""
    return vae.encode(as_clip(images) * 2 - 1).latent_dist.mode()


def reconstruction(vae: AutoencoderKLWan, images: torch.Tensor, clamped: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(the VAE's reconstruction, its input) of [B, 3, H, W] images (or [B, 3, F, H, W] clips) in
    [0, 1], both [B, 3, F, H, W] in the VAE's [-1, 1] range (F = 1 for images); differentiable
    (what VAE training compares). `clamped=False` returns the decoder's output before diffusers'
    clamp to [-1, 1] (`decode_unclamped`)."""
    if images.dim() == 5:
        _check_clips(images)
        clip = images * 2.0 - 1.0
    else:
        clip = as_clip(images * 2.0 - 1.0)
    latents = vae.encode(clip).latent_dist.mode()
    return (vae.decode(latents).sample if clamped else decode_unclamped(vae, latents)), clip


def decode_unclamped(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """`vae.decode(latents).sample` before its final clamp to [-1, 1] (diffusers' untiled
    `AutoencoderKLWan._decode`, step for step; a test checks clamping this gives decode's output).
    A loss on the clamped output has no gradient where the output overshoots the range: a VAE
    that draws a white frame above 1 (the shapes bases' VAEs, made on black, do on Push-T's white
    scene) never learns the objects on it."""
    vae.clear_cache()
    x = vae.post_quant_conv(latents)
    frames = []
    for i in range(x.shape[2]):
        vae._conv_idx = [0]
        frames.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=i == 0))
    out = torch.cat(frames, 2)
    if vae.config.patch_size is not None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        out = unpatchify(out, patch_size=vae.config.patch_size)
    vae.clear_cache()
    return out


def _check_clips(clips: torch.Tensor) -> None:
    if clips.dim() != 5 or clips.shape[1] != 3 or (clips.shape[2] - 1) % 4:
        raise ValueError(f"clips must have shape [B, 3, F = 4k + 1, H, W], got {tuple(clips.shape)}")


def encode_clips(vae: AutoencoderKLWan, clips: torch.Tensor) -> torch.Tensor:
    """[B, 3, F, H, W] in [0, 1] -> normalised latents [B, C, T, h, w] (posterior mean)."""
    _check_clips(clips)
    vae_dtype = next(vae.parameters()).dtype
    return normalised_latents(vae, clips.to(vae_dtype) * 2.0 - 1.0).to(clips.dtype)


def normalised_latents(vae: AutoencoderKLWan, signed: torch.Tensor) -> torch.Tensor:
    """Clips [B, 3, F, H, W] already in the VAE's [-1, 1] range and dtype -> normalised latents
    (the posterior mean, minus `latents_mean`, over `latents_std`), in the VAE's dtype."""
    raw = vae.encode(signed).latent_dist.mode()
    mean, std = _latent_stats(vae, raw)
    return (raw - mean) / std


def decode_clips(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents [B, C, T, h, w] -> clips [B, 3, F, H, W] in [0, 1] (F = 1 for T = 1)."""
    if latents.dim() != 5:
        raise ValueError(f"latents must have shape [B, C, T, h, w], got {tuple(latents.shape)}")
    vae_dtype = next(vae.parameters()).dtype
    z = latents.to(vae_dtype)
    mean, std = _latent_stats(vae, z)
    clip = vae.decode(z * std + mean).sample
    return ((clip + 1.0) / 2.0).clamp(0.0, 1.0).to(latents.dtype)
