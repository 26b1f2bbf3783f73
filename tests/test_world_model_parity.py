"""Cosmos3 as a world model through the project's packed forward: clip continuation (video-to-video)
and the three action modes equal the stock `Cosmos3OmniPipeline`, sample for sample, from a
Nano-layout folder with action heads built by diffusers' classes alone.

Both sides start from the same noise: the pipeline draws it itself from a seeded generator
(vision latents first, then the action rows), and the project gets the same draws. Each side
encodes its own conditioning frames and builds its own caption, so the conditions are part of what
is compared.

The pipeline pads an action run's frames into a canvas of its `resolution_tier` (256x256 at the
least) before encoding them and names that canvas in its caption: its resize policy. The project
takes the frame size it is given. The tests register a tier whose canvas is the frames' own size
(in the pipeline's own resize table), so the pipeline's padding is a no-op and every code path it
runs is its own; `test_the_caption_names_the_pipelines_canvas` checks the caption at a real tier.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from _models_helpers import folder_pipeline
from _video_folders import world_nano_folder
from diffusers.pipelines.cosmos import pipeline_cosmos3_omni
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from diffusers.video_processor import VideoProcessor

from cosmos_rl.core.actions import ActionSpec, action_caption, tier_canvas
from cosmos_rl.core.media import MediaSpec, latent_shape, vae_temporal_factor
from cosmos_rl.models.actions import ActionLayout, action_prompt_ids, chunk_rows, model_rows, raw_actions, start_rows
from cosmos_rl.models.build import load_parts
from cosmos_rl.models.generate import clip_condition_latents, generate
from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.models.text import model_prompt_ids

STEPS = 4
FPS = 10.0  # Push-T's rate, not the transformer's base_fps (24): fractional time positions
SIZE = 32
CHUNK = 4  # 5 frames, 2 latent frames
ACTION_DIM = 10  # pusht rows are 2 wide (8 zero columns), a one-arm robot's 10
TIER = SIZE  # a resolution tier whose canvas is the frame itself (see the module docstring)
PARITY = 2e-6  # max |difference| against the stock pipeline, latents and actions
# Push-T targets are pixel positions in [0, 512]^2: the model's rows are them mapped onto [-1, 1].
PUSHT = dict(embodiment="pusht", chunk=CHUNK, offset=(256.0, 256.0), scale=(256.0, 256.0))
DESCRIPTIONS = ["push the T block to the goal", "move the agent left", "x", "push the block up and rotate it clockwise"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Every tensor here is tiny: a second OpenMP thread only adds synchronisation, which on a
    # busy 2-core machine made each test ~10x slower. Both sides run under the same setting.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return world_nano_folder(tmp_path_factory.mktemp("world_nano") / "pipe", seed=5, action_dim=ACTION_DIM)


@pytest.fixture(scope="module")
def parts(folder):
    return load_parts(folder, heads=True)  # the action heads load with the rest


@pytest.fixture(scope="module")
def pipe(folder):
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(pipeline_cosmos3_omni._ACTION_RESOLUTION_BINS, str(TIER), {"1.0": (SIZE, SIZE)})
        yield folder_pipeline(folder)


def _clips(batch: int, frames: int) -> np.ndarray:
    # A coloured square per sample on grey, moving a few pixels a frame: frames whose latents differ.
    clips = np.full((batch, frames, SIZE, SIZE, 3), 96, dtype=np.uint8)
    colours = [(220, 30, 30), (30, 200, 40), (40, 40, 230), (230, 220, 20)]
    for index in range(batch):
        for frame in range(frames):
            top, left = 3 + 2 * index, 2 + (2 * frame) % 16
            clips[index, frame, top : top + 10, left : left + 10] = colours[index]
    return clips


def _frames(clip: np.ndarray) -> list[Image.Image]:
    # The pipeline's canonical clip input (what diffusers.utils.load_video returns): it reads a
    # numpy clip as floats in [0, 1], so uint8 frames go to it as PIL images.
    return [Image.fromarray(frame) for frame in clip]


def _draws(seed: int, vision_shape: tuple[int, ...], rows: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    # What the pipeline's prepare_latents draws from its generator: vision noise, then action noise.
    generator = torch.Generator().manual_seed(seed)
    vision = torch.randn((1, *vision_shape), generator=generator)
    actions = torch.randn((rows, ACTION_DIM), generator=generator) if rows is not None else None
    return vision, actions


def _raw(batch: int) -> torch.Tensor:
    # Agent targets in Push-T pixels, one smooth path per sample.
    steps = torch.arange(CHUNK, dtype=torch.float32)[None, :, None]
    start = torch.tensor([[100.0, 400.0], [250.0, 250.0], [480.0, 30.0], [10.0, 500.0]])[:batch, None]
    return start + steps * torch.tensor([[[12.0, -9.0]]]) * torch.arange(1, batch + 1)[:, None, None]


def _seeds(mode: str, batch: int, guidance: float) -> list[int]:
    return [1000 * len(mode) + 100 * batch + 10 * int(guidance) + index for index in range(batch)]


# (samples, guidance): 4 samples go through one packed forward per step (8 when guided), the
# pipeline gets them one call each; guidance applies to the action rows as to the frames.
CASES = [(1, 1.0), (4, 1.0), (4, 3.0)]


@pytest.mark.parametrize("batch, guidance", CASES)
def test_video_to_video_matches_the_stock_pipeline(parts, pipe, batch, guidance):
    # The leading 2 latent frames (the clip's first 5 frames) clean; the pipeline's video= path with
    # condition_frame_indexes_vision=[0, 1].
    media = MediaSpec(frames=9, height=SIZE, width=SIZE, fps=FPS)
    shape = latent_shape(media, parts.vae.config, parts.transformer.config)
    clips = _clips(batch, media.frames)
    seeds = _seeds("v2v", batch, guidance)
    noise = torch.cat([_draws(seed, shape, None)[0] for seed in seeds])
    condition = clip_condition_latents(parts.vae, torch.from_numpy(clips), 2)
    ids = model_prompt_ids(parts.tokenizer, "chat", DESCRIPTIONS[:batch], media)
    latents, pixels = generate(parts, media, ids, noise, SamplerSettings(STEPS, None, guidance), condition=condition)
    expected = torch.cat([
        pipe(
            prompt=DESCRIPTIONS[index], video=_frames(clips[index]), condition_frame_indexes_vision=[0, 1], num_frames=media.frames,
            height=SIZE, width=SIZE, fps=FPS, num_inference_steps=STEPS, guidance_scale=guidance,
            generator=torch.Generator().manual_seed(seeds[index]), output_type="latent",
        ).video
        for index in range(batch)
    ])  # fmt: skip
    assert latents.shape == expected.shape == (batch, *shape)
    assert (latents - expected).abs().max() <= PARITY
    assert torch.equal(latents[:, :, :2], condition)  # the conditioning frames, held
    assert pixels.shape == (batch, media.frames, SIZE, SIZE, 3)


def _stock_action_run(pipe, spec: ActionSpec, description: str, clip: np.ndarray, raw: torch.Tensor, guidance: float, seed: int):
    condition = CosmosActionCondition(
        mode=spec.mode, chunk_size=spec.chunk, domain_name=spec.embodiment, resolution_tier=TIER,
        raw_actions=raw if spec.mode == "forward_dynamics" else None,
        image=_frames(clip)[0] if spec.mode != "inverse_dynamics" else None,
        video=_frames(clip) if spec.mode == "inverse_dynamics" else None, view_point=spec.view_point,
    )  # fmt: skip
    out = pipe(
        prompt=description, action=condition, fps=FPS, num_inference_steps=STEPS, guidance_scale=guidance,
        generator=torch.Generator().manual_seed(seed), output_type="latent",
    )  # fmt: skip
    return out.video, (out.action[0] if out.action is not None else None)


@pytest.mark.parametrize("batch, guidance", CASES)
@pytest.mark.parametrize("mode", ["forward_dynamics", "inverse_dynamics", "policy"])
def test_action_modes_match_the_stock_pipeline(parts, pipe, mode, batch, guidance):
    spec = ActionSpec(mode=mode, **PUSHT)
    media = spec.media(SIZE, SIZE, FPS)
    shape = latent_shape(media, parts.vae.config, parts.transformer.config)
    clips = _clips(batch, media.frames)
    raw = _raw(batch)
    rows_clean = model_rows(spec, raw, ACTION_DIM)  # the model's rows: what the pipeline is given
    seeds = _seeds(mode, batch, guidance)
    draws = [_draws(seed, shape, CHUNK) for seed in seeds]
    noise = torch.cat([vision for vision, _ in draws])
    layout = ActionLayout.of(spec, batch)
    rows = start_rows(torch.stack([actions for _, actions in draws]), rows_clean if mode == "forward_dynamics" else None, layout)
    clean_frames = spec.clean_frames(vae_temporal_factor(parts.vae.config))
    condition = clip_condition_latents(parts.vae, torch.from_numpy(clips), clean_frames)
    ids = action_prompt_ids(parts.tokenizer, "chat", DESCRIPTIONS[:batch], spec, media)
    latents, pixels, rows_out = generate(
        parts, media, ids, noise, SamplerSettings(STEPS, None, guidance), condition=condition,
        actions=rows, action_layout=layout,
    )  # fmt: skip

    stock = [
        _stock_action_run(pipe, spec, DESCRIPTIONS[index], clips[index], rows_clean[index, :, : spec.width], guidance, seeds[index])
        for index in range(batch)
    ]
    expected = torch.cat([video for video, _ in stock])
    assert latents.shape == expected.shape == (batch, *shape)
    assert (latents - expected).abs().max() <= PARITY
    assert torch.equal(latents[:, :, :clean_frames], condition)
    assert pixels.shape == (batch, media.frames, SIZE, SIZE, 3)
    assert rows_out.shape == (batch, CHUNK, ACTION_DIM) and not rows_out[:, :, spec.width :].any()
    if mode == "forward_dynamics":
        assert all(actions is None for _, actions in stock)  # the pipeline returns no actions here
        assert torch.equal(rows_out, rows_clean)  # the given rows, untouched
    else:
        expected_rows = torch.stack([actions for _, actions in stock])
        assert expected_rows.shape == (batch, CHUNK, spec.width)
        assert (rows_out[:, :, : spec.width] - expected_rows).abs().max() <= PARITY
        assert (rows_out - rows).abs().max() > 0.1  # generated, not the noise they started from
    if mode == "inverse_dynamics":
        assert torch.equal(latents, condition)  # every frame a condition


def _stock_start(pipe, spec: ActionSpec, clip: np.ndarray, raw: torch.Tensor | None, seed: int):
    # The latents and action rows the pipeline's prepare_latents builds from its generator.
    condition = CosmosActionCondition(
        mode=spec.mode, chunk_size=spec.chunk, domain_name=spec.embodiment, resolution_tier=TIER, raw_actions=raw,
        image=_frames(clip)[0],
    )  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    return pipe.prepare_latents(fps=FPS, generator=generator, device="cpu", dtype=torch.float32, action=condition)[:3:2]


def test_the_rows_start_as_the_pipeline_builds_them(parts, pipe):
    # Forward dynamics: a short sequence repeats its last action, a long one is cut, the padding is
    # zero; policy: the rows are the generator's noise with the padding zeroed.
    clip = _clips(1, CHUNK + 1)[0]
    shape = latent_shape(MediaSpec(CHUNK + 1, SIZE, SIZE, FPS), parts.vae.config, parts.transformer.config)
    forward = ActionSpec(mode="forward_dynamics", embodiment="pusht", chunk=CHUNK)
    for raw in (torch.tensor([[0.1, -0.2], [0.3, 0.4]]), torch.rand(CHUNK + 3, 2)):
        fitted = chunk_rows(raw, CHUNK)
        expected = raw[:CHUNK] if len(raw) >= CHUNK else torch.cat([raw, raw[-1:].expand(CHUNK - len(raw), 2)])
        assert torch.equal(fitted, expected)
        rows = start_rows(torch.randn(1, CHUNK, ACTION_DIM), model_rows(forward, fitted[None], ACTION_DIM), ActionLayout.of(forward, 1))
        assert torch.equal(rows[0], _stock_start(pipe, forward, clip, raw, seed=3)[1])
    policy = ActionSpec(mode="policy", embodiment="pusht", chunk=CHUNK)
    noise, noise_rows = _draws(9, shape, CHUNK)
    rows = start_rows(noise_rows[None], None, ActionLayout.of(policy, 1))
    stock_latents, stock_rows = _stock_start(pipe, policy, clip, None, seed=9)
    assert torch.equal(rows[0], stock_rows)
    assert rows[0, :, :2].abs().min() > 0 and not rows[0, :, 2:].any()
    # Frame 0 is the pipeline's encoding of the frame to the bit, the later frames its noise.
    assert torch.equal(stock_latents[:, :, :1], clip_condition_latents(parts.vae, torch.from_numpy(clip[None]), 1))
    assert torch.equal(stock_latents[:, :, 1:], noise[:, :, 1:])


def test_one_batch_mixes_embodiments_and_modes(parts, pipe):
    # Sample 0: Push-T forward dynamics (its 2-wide rows clean); sample 1: a one-arm robot's policy
    # (10-wide rows generated): per-sample domain ids, widths and clean rows in one packed forward.
    specs = [ActionSpec(mode="forward_dynamics", **PUSHT), ActionSpec(mode="policy", embodiment="bridge_orig_lerobot", chunk=CHUNK)]
    media = specs[0].media(SIZE, SIZE, FPS)
    shape = latent_shape(media, parts.vae.config, parts.transformer.config)
    clips = _clips(2, media.frames)
    clean = torch.zeros(2, CHUNK, ACTION_DIM)
    clean[:1] = model_rows(specs[0], _raw(1), ACTION_DIM)
    draws = [_draws(seed, shape, CHUNK) for seed in (21, 22)]
    layout = ActionLayout(CHUNK, (4, 7), (2, 10), (CHUNK, 0))
    rows = start_rows(torch.stack([actions for _, actions in draws]), clean, layout)
    ids = [action_prompt_ids(parts.tokenizer, "chat", [DESCRIPTIONS[i]], spec, media) for i, spec in enumerate(specs)]
    latents, _, rows_out = generate(
        parts, media, ([i[0][0] for i in ids], [i[1][0] for i in ids]), torch.cat([vision for vision, _ in draws]),
        SamplerSettings(STEPS, None, 3.0), condition=clip_condition_latents(parts.vae, torch.from_numpy(clips), 1),
        actions=rows, action_layout=layout,
    )  # fmt: skip
    stock = [
        _stock_action_run(pipe, spec, DESCRIPTIONS[i], clips[i], clean[i, :, : spec.width], 3.0, seed)
        for i, (spec, seed) in enumerate(zip(specs, (21, 22)))
    ]
    assert (latents - torch.cat([video for video, _ in stock])).abs().max() <= PARITY
    assert torch.equal(rows_out[0], clean[0])
    assert (rows_out[1] - stock[1][1]).abs().max() <= PARITY and stock[1][1].shape == (CHUNK, 10)


def test_the_caption_names_the_pipelines_canvas(parts, pipe):
    # At a real tier the pipeline pads a 96x96 frame into 256x256 and names 256x256: the project's
    # caption names whatever size it is given, here the pipeline's canvas.
    spec = ActionSpec(mode="policy", embodiment="pusht", chunk=CHUNK, view_point="third_person_view")
    canvas = tier_canvas(96, 96, 256)
    assert canvas == (256, 256)
    media = spec.media(*canvas, FPS)
    cond, uncond = action_prompt_ids(parts.tokenizer, "chat", ["push the T block"], spec, media, negative_prompt="blurry")
    expected = pipe.tokenize_prompt(
        "push the T block", "blurry", num_frames=CHUNK + 1, height=256, width=256, fps=FPS, action_mode="policy",
        action_view_point="third_person_view",
    )  # fmt: skip
    assert (cond[0].tolist(), uncond[0].tolist()) == expected
    text = parts.tokenizer.decode(cond[0])
    assert '"resolution": {"H": 256, "W": 256}' in text and "third-person perspective" in text
    for height, width, tier in [(96, 96, 256), (96, 160, 256), (480, 640, 480), (720, 1280, 720), (300, 200, 704)]:
        assert tier_canvas(height, width, tier) == VideoProcessor.classify_height_width_bin(
            height, width, ratios=pipeline_cosmos3_omni._ACTION_RESOLUTION_BINS[str(tier)]
        )


@pytest.mark.parametrize(
    "description, view_point, frames, fps, height, width",
    [
        ("push the T block", "ego_view", 9, 10.0, 96, 96),
        ("rotate it!", None, 61, 24.0, 480, 832),
        ("  ", "wrist_view", 5, 30.0, 720, 1280),
        ("turn left.", "concat_view", 121, 16.0, 256, 320),
        ("stop", "third_person_view", 1500, 10.0, 192, 320),
    ],
)
def test_the_action_caption_is_the_pipelines(description, view_point, frames, fps, height, width):
    expected = pipeline_cosmos3_omni.Cosmos3OmniPipeline._build_action_json_prompt(
        description, view_point=view_point, num_frames=frames, fps=fps, height=height, width=width
    )
    assert action_caption(description, view_point=view_point, frames=frames, fps=fps, height=height, width=width) == expected


def test_normalisation_round_trips_and_rejects_bad_values():
    spec = ActionSpec(mode="forward_dynamics", **PUSHT)
    raw = _raw(2)
    rows = model_rows(spec, raw, ACTION_DIM)
    assert rows.shape == (2, CHUNK, ACTION_DIM) and not rows[:, :, 2:].any()
    assert torch.allclose(rows[0, 0, :2], torch.tensor([(100 - 256) / 256, (400 - 256) / 256]))
    assert torch.allclose(raw_actions(spec, rows), raw)
    assert spec.normalise((512.0, 0.0)) == (1.0, -1.0) and spec.denormalise((1.0, -1.0)) == (512.0, 0.0)
    with pytest.raises(ValueError, match="offset needs 2 finite numbers"):
        ActionSpec(mode="policy", embodiment="pusht", chunk=4, offset=(0.0,), scale=(1.0,))
    with pytest.raises(ValueError, match="no fixed action width"):
        ActionSpec(mode="policy", embodiment="libero", chunk=4)
    with pytest.raises(ValueError, match="view_point 'top'"):
        ActionSpec(mode="policy", embodiment="pusht", chunk=4, view_point="top")
    with pytest.raises(ValueError, match="agibotworld actions have 29 columns, the model's action_dim is 10"):
        model_rows(ActionSpec(mode="policy", embodiment="agibotworld", chunk=CHUNK), torch.zeros(1, CHUNK, 29), ACTION_DIM)


def test_rows_the_model_cannot_take_are_refused(parts):
    spec = ActionSpec(mode="policy", embodiment="pusht", chunk=CHUNK)
    media = spec.media(SIZE, SIZE, FPS)
    noise = torch.randn(1, *latent_shape(media, parts.vae.config, parts.transformer.config))
    ids = action_prompt_ids(parts.tokenizer, "chat", ["x"], spec, media)
    condition = clip_condition_latents(parts.vae, torch.from_numpy(_clips(1, 1)), 1)
    settings = SamplerSettings(1, None, 1.0)
    padded = torch.randn(1, CHUNK, ACTION_DIM)  # noise in the padding columns too
    with pytest.raises(ValueError, match="nonzero past its width 2"):
        generate(parts, media, ids, noise, settings, condition=condition, actions=padded, action_layout=ActionLayout.of(spec, 1))
    far = ActionLayout(CHUNK, (21,), (2,), (0,))  # a domain the model has no projection for
    with pytest.raises(ValueError, match="domain id 21 is not below the model's num_embodiment_domains 21"):
        generate(parts, media, ids, noise, settings, condition=condition, actions=start_rows(padded, None, far), action_layout=far)
