"""The media spec: one value from the manifest's size keys, and latent shapes from what the VAE's network does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLWan

from cosmos_rl.planning import plan
from cosmos_rl.config import load
from cosmos_rl.models.build import build_preset
from cosmos_rl.core.media import MediaSpec, latent_frames, latent_shape, vae_spatial_factor, vae_temporal_factor
from cosmos_rl.models.vae import encode_images

ROOT = Path(__file__).resolve().parent.parent
DPO = ROOT / "manifests" / "dpo_t2i_smoke.toml"


def _manifest(tmp_path: Path, size_lines: str) -> Path:
    """The DPO smoke manifest with its `image_size = 32` line replaced by `size_lines`."""
    text = DPO.read_text()
    assert "\nimage_size = 32\n" in text
    path = tmp_path / "m.toml"
    path.write_text(text.replace("\nimage_size = 32\n", f"\n{size_lines}\n"))
    return path


def _errors(path: Path) -> dict[str, str]:
    _, problems = load.load_all_problems(path)
    return {p.path: p.render() for p in problems if p.severity == "error"}


@pytest.mark.parametrize(
    "lines, size",
    [("image_size = 64", (64, 64)), ("height = 32\nwidth = 48", (32, 48)), ("", (32, 32))],
    ids=["square", "height-width", "default"],
)
def test_a_manifest_names_its_size_once(tmp_path, lines, size):
    path = _manifest(tmp_path, lines)
    assert _errors(path) == {}
    assert MediaSpec.from_model_config(load.load(path).model) == MediaSpec(frames=1, height=size[0], width=size[1])


def test_a_saved_manifest_with_height_and_width_loads_as_it_was(tmp_path):
    # The run directory's manifest.toml is the resolved config: image_size stays out of it.
    config = load.load(_manifest(tmp_path, "height = 32\nwidth = 48"))
    saved = tmp_path / "saved.toml"
    saved.write_text(load.to_toml(config))
    assert "image_size" not in saved.read_text()
    assert _errors(saved) == {} and load.load(saved, saved_run=True) == config


@pytest.mark.parametrize(
    "lines, key, text",
    [
        ("image_size = 32\nheight = 32", "model.image_size", "given together with model.height"),
        ("image_size = 32\nheight = 32\nwidth = 32", "model.image_size", "given together with model.height and model.width"),
        ("height = 32", "model.width", "missing: model.height is set"),
        ("width = 32", "model.height", "missing: model.width is set"),
        ("height = 40\nwidth = 32", "model.height", "multiple of 16"),
        ("height = 32\nwidth = 8", "model.width", "multiple of 16"),
    ],
)
def test_preflight_judges_the_size_keys_naming_them(tmp_path, lines, key, text):
    found = _errors(_manifest(tmp_path, lines))
    assert key in found, found
    assert text in found[key]


def test_the_new_size_keys_at_their_default_leave_every_run_identity_alone():
    # identity_fields sees exactly what it saw before height and width existed.
    for manifest in sorted((ROOT / "manifests").glob("*.toml")):
        config = load.load(manifest)
        fields = plan.identity_fields(config)
        if config.model.height is not None:  # the public video manifests name 480 x 832, the world model's 96 x 96 (Bridge's 256 x 256, CPU NFT: 32 x 32): identity
            sizes = (256, 256) if "bridge" in manifest.name else (96, 96) if "world" in manifest.name else (32, 32) if "pusht" in manifest.name else (480, 832)
            assert (fields["model.height"], fields["model.width"]) == sizes and "model.image_size" not in fields, manifest.name
            continue
        assert "model.height" not in fields and "model.width" not in fields, manifest.name
        assert fields["model.image_size"] in (32, 512), manifest.name


def test_latent_shape_follows_the_network_not_the_config():
    # A VAE whose config claims 8x spatial and 4x temporal compression while the network does 4x
    # and 2x (two stages, one of them temporal, after a patchify of 2).
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, attn_scales=[], temperal_downsample=[True],
        patch_size=2, in_channels=12, out_channels=12, latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
        scale_factor_spatial=8, scale_factor_temporal=4,
    )  # fmt: skip
    assert (vae_spatial_factor(vae.config), vae_temporal_factor(vae.config)) == (4, 2)
    transformer = {"latent_channel": 4}
    clip = MediaSpec(frames=5, height=32, width=48)
    with torch.no_grad():
        encoded = vae.encode(torch.zeros(1, 3, 5, 32, 48)).latent_dist.mode()
    assert tuple(encoded.shape[1:]) == latent_shape(clip, vae.config, transformer) == (4, 3, 8, 12)
    assert latent_shape(MediaSpec.image(32, 48), vae.config, transformer) == (4, 1, 8, 12)


def test_the_presets_latents_are_one_frame_at_a_quarter_of_the_side():
    for name in ("tiny", "shapes"):
        parts = build_preset(name, seed=0)
        shape = latent_shape(MediaSpec.image(32), parts.vae.config, parts.transformer.config)
        with torch.no_grad():
            assert tuple(encode_images(parts.vae, torch.rand(1, 3, 32, 32)).shape[1:]) == shape == (4, 1, 8, 8)
        # The config says what the network does (diffusers' pipeline reads it for time positions).
        assert parts.vae.config.scale_factor_temporal == vae_temporal_factor(parts.vae.config) == 1
        assert parts.vae.config.scale_factor_spatial == vae_spatial_factor(parts.vae.config)


def test_latent_frames_are_frame_zero_then_chunks_of_four():
    assert [latent_frames(f, 4) for f in (1, 5, 9)] == [1, 2, 3]
    assert [latent_frames(f, 1) for f in (1, 5)] == [1, 5]
    with pytest.raises(ValueError, match="4k \\+ 1"):
        latent_frames(6, 4)


def test_size_json_is_the_side_of_a_square():
    assert MediaSpec.image(32).size_json() == 32 and MediaSpec.image(32, 48).size_json() == [32, 48]
    with pytest.raises(ValueError):
        MediaSpec(frames=1, height=0, width=32)
