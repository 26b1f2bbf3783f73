"""Video through the model: the project's `generate` equals the stock `Cosmos3OmniPipeline` for
text-to-video and image-to-video, from a Nano-layout folder whose VAE compresses time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models_helpers import NANO_HEADS, folder_pipeline
from _video_folders import video_nano_folder

from cosmos_rl.models.build import load_parts
from cosmos_rl.models.generate import condition_latents, generate
from cosmos_rl.core.media import MediaSpec, latent_shape
from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.models.text import model_prompt_ids

STEPS = 6
FPS = 16.0  # not the transformer's base_fps (24): latent frames sit at fractional time positions
PARITY = 2e-6  # max |latent difference| against the stock pipeline
PROMPTS = ["a red square moving left", "two blue circles", "x", "a green triangle turning red"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return video_nano_folder(tmp_path_factory.mktemp("video_nano") / "pipe", seed=3)


@pytest.fixture(scope="module")
def parts(folder):
    return load_parts(folder, skip_keys=NANO_HEADS)


@pytest.fixture(scope="module")
def pipe(folder):
    return folder_pipeline(folder)


def _noise(media: MediaSpec, parts, batch: int, seed: int) -> torch.Tensor:
    shape = latent_shape(media, parts.vae.config, parts.transformer.config)
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed))


def _first_frames(batch: int) -> np.ndarray:
    # Flat coloured squares on grey, one per sample: an image whose latent is not noise-like.
    frames = np.full((batch, 32, 32, 3), 96, dtype=np.uint8)
    for index in range(batch):
        frames[index, 4 + 4 * index : 16 + 4 * index, 6:18] = [(220, 30, 30), (30, 200, 40), (40, 40, 230), (230, 220, 20)][index]
    return frames


def _pipeline(pipe, prompt, media, guidance, latents, image=None):
    with torch.no_grad():
        return pipe(
            prompt=prompt, image=image, num_frames=media.frames, height=media.height, width=media.width,
            fps=media.fps, num_inference_steps=STEPS, guidance_scale=guidance, latents=latents[None],
            output_type="latent",
        ).video  # fmt: skip


def test_the_folder_compresses_time_four_fold(parts):
    media = MediaSpec(frames=9, height=32, width=32, fps=FPS)
    assert latent_shape(media, parts.vae.config, parts.transformer.config) == (4, 3, 8, 8)


@pytest.mark.parametrize("frames", [5, 9])
@pytest.mark.parametrize("prompts", [1, 4])
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_text_to_video_matches_the_stock_pipeline(parts, pipe, frames, prompts, guidance):
    # 4 prompts go through one packed forward per step; the pipeline gets them one call each.
    media = MediaSpec(frames=frames, height=32, width=32, fps=FPS)
    noise = _noise(media, parts, prompts, seed=frames + prompts)
    ids = model_prompt_ids(parts.tokenizer, "chat", PROMPTS[:prompts], media)
    latents, clips = generate(parts, media, ids, noise, SamplerSettings(STEPS, None, guidance))
    expected = torch.cat([_pipeline(pipe, PROMPTS[i], media, guidance, noise[i]) for i in range(prompts)])
    assert latents.shape == expected.shape == noise.shape
    assert (latents - expected).abs().max() <= PARITY
    assert clips.shape == (prompts, frames, 32, 32, 3) and clips.dtype == torch.uint8


@pytest.mark.parametrize("frames", [5, 9])
@pytest.mark.parametrize("prompts", [1, 4])
def test_image_to_video_matches_the_stock_pipeline(parts, pipe, frames, prompts):
    # The pipeline's image= path encodes a clip of copies of the image and keeps latent frame 0
    # clean. Given latents=, it does not write that frame itself, so its latents carry the
    # pipeline's own encoding of the image in frame 0; generate gets the noise and the condition.
    media = MediaSpec(frames=frames, height=32, width=32, fps=FPS)
    noise = _noise(media, parts, prompts, seed=100 + frames + prompts)
    images = _first_frames(prompts)
    condition = condition_latents(parts.vae, torch.from_numpy(images))
    ids = model_prompt_ids(parts.tokenizer, "chat", PROMPTS[:prompts], media)
    latents, _ = generate(parts, media, ids, noise, SamplerSettings(STEPS, None, 3.0), condition=condition)
    expected = []
    for index in range(prompts):
        copies = torch.from_numpy(images[index]).permute(2, 0, 1)[:, None].expand(3, frames, 32, 32)
        encoded = pipe._encode_video((copies.float() / 127.5 - 1.0)[None])[0, :, :1]
        start = noise[index].clone()
        start[:, :1] = encoded
        expected.append(_pipeline(pipe, PROMPTS[index], media, 3.0, start, image=images[index]))
    expected = torch.cat(expected)
    assert (condition[:, :, 0] - expected[:, :, 0]).abs().max() <= PARITY  # the image's latent, kept
    assert (latents - expected).abs().max() <= PARITY


def test_a_conditioned_frame_is_held_and_the_rest_follow_it(parts):
    # Two different first frames with identical noise: frame 0 stays each one's latent, and the
    # generated frames after it differ (they are conditioned on it).
    media = MediaSpec(frames=5, height=32, width=32, fps=FPS)
    noise = _noise(media, parts, 1, seed=7).expand(2, -1, -1, -1, -1).contiguous()
    condition = condition_latents(parts.vae, torch.from_numpy(_first_frames(2)))
    ids = model_prompt_ids(parts.tokenizer, "chat", [PROMPTS[0]] * 2, media)
    latents, _ = generate(parts, media, ids, noise, SamplerSettings(STEPS, None, 1.0), condition=condition)
    assert (latents[:, :, :1] - condition).abs().max() <= 1e-5
    assert (latents[0, :, 1:] - latents[1, :, 1:]).abs().max() > 1e-3


def test_video_prompts_carry_the_pipelines_sentences(parts, pipe):
    media = MediaSpec(frames=9, height=32, width=48, fps=FPS)
    cond, uncond = model_prompt_ids(parts.tokenizer, "chat", [PROMPTS[0]], media)
    expected = pipe.tokenize_prompt(PROMPTS[0], None, num_frames=9, height=32, width=48, fps=FPS)
    assert cond[0].tolist() == expected[0] and uncond[0].tolist() == expected[1]
    text = parts.tokenizer.decode(cond[0])
    assert "The video is 0.6 seconds long and is of 16 FPS." in text and "This video is of 32x48 resolution." in text
    assert "not 0.6 seconds" in parts.tokenizer.decode(uncond[0])
    # A minimal-template model (the shapes bases) gets the caption's bytes only, video or not.
    minimal, _ = model_prompt_ids(parts.tokenizer, "minimal", [PROMPTS[0]], media)
    assert parts.tokenizer.decode(minimal[0][:-2]) == PROMPTS[0]
