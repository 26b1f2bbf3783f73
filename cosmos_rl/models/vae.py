"""Images <-> normalised latents with the Wan VAE, which works on videos ([B, C, T, H, W])."""

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


def encode_images(vae: AutoencoderKLWan, images: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> normalised latents [B, C, h, w] (posterior mean, so deterministic)."""
    _check_images(images)
    vae_dtype = next(vae.parameters()).dtype
    video = (images.to(vae_dtype) * 2.0 - 1.0).unsqueeze(2)  # one frame, in the VAE's [-1, 1] range
    raw = vae.encode(video).latent_dist.mode()
    mean, std = _latent_stats(vae, raw)
    return ((raw - mean) / std).squeeze(2).to(images.dtype)


def decode_latents(vae: AutoencoderKLWan, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents [B, C, h, w] -> images [B, 3, H, W] in [0, 1]."""
    if latents.dim() != 4:
        raise ValueError(f"latents must have shape [B, C, h, w], got {tuple(latents.shape)}")
    vae_dtype = next(vae.parameters()).dtype
    z = latents.to(vae_dtype).unsqueeze(2)
    mean, std = _latent_stats(vae, z)
    video = vae.decode(z * std + mean).sample  # [B, 3, 1, H, W], clamped to [-1, 1]
    return ((video.squeeze(2) + 1.0) / 2.0).clamp(0.0, 1.0).to(latents.dtype)
