"""The `shapes_video` preset: its starting point, the shipped weights and their manifest."""

from __future__ import annotations

import torch

from cosmos_rl.shapes.clips import render_clip
from cosmos_rl.models.shapes_preset import load_shapes_base
from cosmos_rl.commands.video_base_build import initial_parts


def _clip(caption: str, seed: int) -> torch.Tensor:
    return torch.from_numpy(render_clip(caption, seed)).float().div(255).permute(3, 0, 1, 2)[None] * 2 - 1


def test_the_video_vae_starts_as_the_image_vae_on_the_first_frame():
    # A causal Wan VAE passes frame 0 around the temporal stage, so with the image base's weights
    # everywhere else the first latent frame and the first decoded frame are the image VAE's.
    video, image = initial_parts(0), load_shapes_base()
    clip = _clip("a red square moving left", 3)
    with torch.no_grad():
        z_video = video.vae.encode(clip).latent_dist.mode()
        z_image = image.vae.encode(clip[:, :, :1]).latent_dist.mode()
        assert z_video.shape == (1, 4, 5, 8, 8)  # 9 frames -> 1 + 8 / 2 latent frames
        assert torch.equal(z_video[:, :, :1], z_image)
        assert torch.equal(video.vae.decode(z_video).sample[:, :, :1], image.vae.decode(z_image).sample)
    assert torch.equal(video.transformer.proj_in.weight, image.transformer.proj_in.weight)
    # The temporal stage is new: its weights are the seed's, not zeros and not the image base's.
    assert any(".time_conv." in name and p.abs().sum() > 0 for name, p in video.vae.named_parameters())


def test_the_shipped_video_base_is_a_preset_with_a_temporal_vae():
    from cosmos_rl.models.build import build_preset
    from cosmos_rl.models.shapes_preset import read_manifest
    from cosmos_rl.models.shapes_video_preset import REBUILD, WEIGHTS_DIR

    parts = build_preset("shapes_video", seed=123)
    assert parts.prompt_template == "minimal"
    assert list(parts.vae.config.temperal_downsample) == [True] and parts.vae.config.scale_factor_temporal == 2
    manifest = read_manifest(WEIGHTS_DIR, REBUILD)
    assert manifest["preset"] == "shapes_video" and manifest["media"] == {"fps": 24.0, "frames": 9, "size": 32}
    assert all(info["bytes"] < 4 * 2**20 for info in manifest["files"].values())
    assert manifest["latents_std"] == list(parts.vae.config.latents_std)
    for mode in ("t2v", "i2v"):
        scores = manifest["held_out"][mode]
        assert scores["clips"] == 319 * manifest["recipe"]["eval_seeds"]
        assert 0.0 <= scores["strict"] <= scores["partial"] <= 1.0
