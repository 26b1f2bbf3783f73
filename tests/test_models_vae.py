"""Images <-> normalised latents agree with the diffusers pipeline's own encode and decode."""

from __future__ import annotations

import pytest
import torch
from _models_helpers import stock_pipeline

from cosmos_rl.models.build import build_preset
from cosmos_rl.models.vae import decode_latents, encode_images


@pytest.fixture(scope="module")
def parts():
    return build_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def images():
    return torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_encode_gives_8x8x4_latents_deterministically(parts, images):
    with torch.no_grad():
        first, second = encode_images(parts.vae, images), encode_images(parts.vae, images)
    assert first.shape == (2, 4, 1, 8, 8)
    assert torch.equal(first, second)


def test_encode_matches_the_pipeline_normalised_encoding(parts, images):
    pipe = stock_pipeline(parts)
    with torch.no_grad():
        # The pipeline encodes videos in [-1, 1], [B, 3, T, H, W].
        expected = pipe._encode_video(images[:, :, None] * 2 - 1)
        got = encode_images(parts.vae, images)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_each_image_is_encoded_independently(parts, images):
    with torch.no_grad():
        batched = encode_images(parts.vae, images)
        single = encode_images(parts.vae, images[1:])
    torch.testing.assert_close(batched[1:], single, atol=1e-6, rtol=0)


def test_decode_matches_the_pipeline_image_output(parts):
    pipe = stock_pipeline(parts)
    noise = torch.randn(1, 4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    common = dict(prompt="a cat", num_frames=1, height=32, width=32, num_inference_steps=2, latents=noise)
    with torch.no_grad():
        latents = pipe(output_type="latent", **common).video  # [1, C, 1, h, w]
        image = pipe(output_type="pt", **common).video  # [T=1, 3, H, W] in [0, 1]
        got = decode_latents(parts.vae, latents)
    assert got.shape == (1, 3, 32, 32)
    assert got.min() >= 0 and got.max() <= 1
    torch.testing.assert_close(got, image, atol=1e-6, rtol=0)


def test_wrong_shapes_are_rejected(parts):
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        encode_images(parts.vae, torch.rand(3, 32, 32))
    with pytest.raises(ValueError, match=r"\[B, C, T=1, h, w\]"):
        decode_latents(parts.vae, torch.rand(1, 4, 8, 8))


def test_the_unclamped_decode_is_decode_before_its_clamp():
    # The shapes video VAE on a white clip overshoots [-1, 1] (what the Push-T build met): clamped,
    # the unclamped output is diffusers' decode exactly, and some of it lies outside the range.
    from cosmos_rl.models.vae import decode_unclamped, reconstruction

    vae = build_preset("shapes_video", 0).vae
    clip = torch.ones(1, 3, 9, 32, 32)
    clip[:, :, :, 8:16, 8:16] = 0.4  # a grey square on white
    with torch.no_grad():
        latents = vae.encode(clip * 2 - 1).latent_dist.mode()
        unclamped = decode_unclamped(vae, latents)
        assert torch.equal(unclamped.clamp(-1, 1), vae.decode(latents).sample)
        assert (unclamped.abs() > 1).any()
        decoded, _ = reconstruction(vae, clip, clamped=False)
        assert torch.equal(decoded, unclamped)
