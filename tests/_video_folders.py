"""A tiny Cosmos3-Nano-layout video folder built with diffusers' classes alone (no project code).

Its VAE compresses time 4x (two temporal stages, which also halve space twice: 32x32 pixels ->
8x8 latents), its transformer carries the Nano sound and action heads and modulates time by fps,
and its tokenizer is the project's byte-level chat tokenizer (data, not a model), so the folder exercises what a real Cosmos3
folder does on a video call: the video system prompt, the duration and resolution sentences,
fractional time positions and temporal compression.
"""

from __future__ import annotations

from pathlib import Path

from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler

from cosmos_rl.models.tokenizer import build_tiny_tokenizer


def temporal_vae() -> AutoencoderKLWan:
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[True, True],
        latents_mean=[0.1, -0.2, 0.05, 0.0],
        latents_std=[0.9, 1.1, 1.2, 0.8],
        scale_factor_spatial=4,
        scale_factor_temporal=4,
    )


def nano_transformer(vocab_size: int, *, action_dim: int = 6, embodiment_domains: int = 4) -> Cosmos3OmniTransformer:
    return Cosmos3OmniTransformer(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        latent_channel=4,
        latent_patch_size=2,
        patch_latent_dim=16,
        rope_axes_dim=[4, 2, 2],
        vocab_size=vocab_size,
        dtype="float32",
        sound_gen=True,
        sound_dim=8,
        action_gen=True,
        action_dim=action_dim,
        num_embodiment_domains=embodiment_domains,
    )


def video_nano_folder(folder: Path, *, seed: int = 0) -> Path:
    """Write the folder with `save_pretrained` (model_index.json, transformer/, vae/,
    text_tokenizer/, scheduler/) and return it."""
    import torch

    torch.manual_seed(seed)
    tokenizer = build_tiny_tokenizer()
    return _save(folder, tokenizer, temporal_vae(), nano_transformer(len(tokenizer)))


def world_nano_folder(folder: Path, *, seed: int = 0, action_dim: int = 6) -> Path:
    """The video folder with action heads an action run can use: 21 embodiment domains, as
    Cosmos3-Nano has (`pusht` is domain 4), `action_dim` columns."""
    import torch

    torch.manual_seed(seed)
    tokenizer = build_tiny_tokenizer()
    vae = temporal_vae()
    return _save(folder, tokenizer, vae, nano_transformer(len(tokenizer), action_dim=action_dim, embodiment_domains=21))


def _save(folder: Path, tokenizer, vae: AutoencoderKLWan, transformer: Cosmos3OmniTransformer) -> Path:
    pipe = Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=tokenizer,
        vae=vae,
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
        enable_safety_checker=False,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder
