"""Packing several samples into one forward must not change any sample's velocity."""

from __future__ import annotations

import pytest
import torch
from _models_helpers import stock_pipeline, stock_velocity

from cosmos_rl.models.build import build_preset
from cosmos_rl.models.lora import add_adapters
from cosmos_rl.core.media import vae_temporal_factor
from cosmos_rl.models.packing import packed_inputs, velocity
from cosmos_rl.models.text import tokenize_prompts

PROMPTS = ["a cat", "a much longer prompt about a dog on a red sofa", "x"]


@pytest.fixture(scope="module")
def parts():
    return build_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def batch(parts):
    cond, _ = tokenize_prompts(parts.tokenizer, PROMPTS, resolution=(32, 32))
    generator = torch.Generator().manual_seed(7)
    x_t = torch.randn(3, 4, 1, 8, 8, generator=generator)
    sigma = torch.tensor([0.9, 0.5, 0.1])
    return x_t, sigma, cond


def _one_at_a_time(transformer, x_t, sigma, ids):
    return torch.cat([velocity(transformer, x_t[i : i + 1], sigma[i : i + 1], [ids[i]]) for i in range(len(ids))])


def test_prompts_really_have_different_lengths(batch):
    _, _, ids = batch
    assert len({len(i) for i in ids}) == 3


def test_packed_batch_equals_one_sample_at_a_time(parts, batch):
    x_t, sigma, ids = batch
    with torch.no_grad():
        packed = velocity(parts.transformer, x_t, sigma, ids)
        singles = _one_at_a_time(parts.transformer, x_t, sigma, ids)
    assert packed.shape == x_t.shape
    torch.testing.assert_close(packed, singles, atol=1e-5, rtol=0)


def test_interleaved_equal_lengths_batch_together_and_come_back_in_order(parts, batch):
    # Equal prompt lengths are packed side by side and attended as one batched call; the caller's
    # order (here interleaved, and with a repeated prompt) must come back unchanged, gradients too.
    x_t, sigma, ids = batch
    order = [1, 0, 2, 0, 1, 2, 0]
    ids7 = [ids[i] for i in order]
    x7 = torch.randn(len(order), *x_t.shape[1:], generator=torch.Generator().manual_seed(3))
    sigma7 = torch.linspace(0.1, 0.9, len(order))
    with torch.no_grad():
        packed = velocity(parts.transformer, x7, sigma7, ids7)
        singles = _one_at_a_time(parts.transformer, x7, sigma7, ids7)
    torch.testing.assert_close(packed, singles, atol=1e-5, rtol=0)

    x_packed, x_single = x7.clone().requires_grad_(), x7.clone().requires_grad_()
    weights = torch.randn_like(x7)
    (velocity(parts.transformer, x_packed, sigma7, ids7) * weights).sum().backward()
    (_one_at_a_time(parts.transformer, x_single, sigma7, ids7) * weights).sum().backward()
    torch.testing.assert_close(x_packed.grad, x_single.grad, atol=1e-5, rtol=0)


def test_a_sample_does_not_see_its_neighbours(parts, batch):
    x_t, sigma, ids = batch
    other_x = x_t.clone()
    other_x[1:] = torch.randn(2, 4, 1, 8, 8, generator=torch.Generator().manual_seed(99))
    other_ids = [ids[0], ids[2], ids[1]]
    with torch.no_grad():
        first = velocity(parts.transformer, x_t, sigma, ids)[0]
        changed_neighbours = velocity(parts.transformer, other_x, sigma, other_ids)[0]
    torch.testing.assert_close(first, changed_neighbours, atol=1e-5, rtol=0)


# The pipeline's integer timesteps for the batch's sigmas [0.9, 0.5, 0.1], worked by hand:
# floor(1000 * float32 sigma), and float32(0.9) = 0.89999998, float32(0.1) = 0.10000000149.
PIPELINE_TIMESTEPS = [899, 500, 100]


def test_single_sample_equals_the_stock_pipeline_transformer_call(batch):
    x_t, sigma, ids = batch
    ours = build_preset("tiny", seed=0)
    reference = build_preset("tiny", seed=0)  # keeps the stock attention processor
    pipe = stock_pipeline(reference)
    with torch.no_grad():
        for i in range(3):
            expected = stock_velocity(pipe, x_t[i : i + 1], PIPELINE_TIMESTEPS[i], ids[i].tolist())
            got = velocity(ours.transformer, x_t[i : i + 1], sigma[i : i + 1], [ids[i]])
            torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)


def test_the_model_sees_the_floor_of_1000_sigma(parts, batch):
    # A training draw between two scheduler timesteps sees the lower one, as the pipeline would.
    x_t, _, ids = batch
    with torch.no_grad():
        low = velocity(parts.transformer, x_t[:1], torch.tensor([0.5004]), ids[:1])
        high = velocity(parts.transformer, x_t[:1], torch.tensor([0.5009]), ids[:1])
        next_bin = velocity(parts.transformer, x_t[:1], torch.tensor([0.5012]), ids[:1])
    assert torch.equal(low, high)
    assert not torch.equal(high, next_bin)


def test_timestep_reaches_the_model_as_sigma(parts, batch):
    x_t, _, ids = batch
    with torch.no_grad():
        low = velocity(parts.transformer, x_t[:1], torch.tensor([0.2]), ids[:1])
        high = velocity(parts.transformer, x_t[:1], torch.tensor([0.8]), ids[:1])
    assert (low - high).abs().max() > 1e-3


# The image reads text only through attention keys/values, so in the LAST layer the text pathway's
# query, output projection, MLP and post-attention norm (and the final text norm) shape nothing.
LAST_LAYER_TEXT_ONLY = ("self_attn.to_q", "self_attn.norm_q", "self_attn.to_out", "mlp.", "post_attention_layernorm.")


def _shapes_the_image(name: str, last_layer: int) -> bool:
    prefix = f"layers.{last_layer}."
    return not (name.startswith(prefix) and name[len(prefix) :].startswith(LAST_LAYER_TEXT_ONLY))


def test_gradients_flow_to_every_weight_that_shapes_the_image(batch):
    x_t, sigma, ids = batch
    transformer = build_preset("tiny", seed=0).transformer
    velocity(transformer, x_t, sigma, ids).square().mean().backward()
    last = len(transformer.layers) - 1
    for name, param in transformer.named_parameters():
        if name.startswith("layers.") and _shapes_the_image(name, last) or name.startswith(("proj_", "time_")):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert transformer.embed_tokens.weight.grad.abs().sum() > 0


def test_gradient_checkpointing_gives_the_same_gradients(batch):
    x_t, sigma, ids = batch
    grads = []
    for checkpointing in (False, True):
        transformer = build_preset("tiny", seed=0).transformer
        if checkpointing:
            transformer.enable_gradient_checkpointing()
        transformer.train()
        velocity(transformer, x_t, sigma, ids).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in transformer.layers.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


def test_lora_wrapped_transformer_packs_exactly_and_trains_the_adapter(batch):
    x_t, sigma, ids = batch
    transformer = build_preset("tiny", seed=0).transformer
    add_adapters(transformer, rank=4, alpha=8, names=["policy"])
    with torch.no_grad():  # make the adapter non-zero so it actually changes the output
        for name, param in transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        packed = velocity(transformer, x_t, sigma, ids)
        singles = _one_at_a_time(transformer, x_t, sigma, ids)
    torch.testing.assert_close(packed, singles, atol=1e-5, rtol=0)

    velocity(transformer, x_t, sigma, ids).square().mean().backward()
    last = len(transformer.layers) - 1
    lora = {n: p for n, p in transformer.named_parameters() if "lora_" in n}
    assert len(lora) > 0
    for name, param in lora.items():
        if _shapes_the_image(name, last):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert all(p.grad is None for n, p in transformer.named_parameters() if "lora_" not in n)


def test_forward_leaves_no_state_behind(parts, batch):
    x_t, sigma, ids = batch
    with torch.no_grad():
        velocity(parts.transformer, x_t, sigma, ids)
    assert parts.transformer._cp_shard_fn is None


def test_mismatched_inputs_are_rejected(parts, batch):
    x_t, sigma, ids = batch
    with pytest.raises(ValueError, match="prompts"):
        velocity(parts.transformer, x_t, sigma, ids[:2])
    with pytest.raises(ValueError, match="sigma"):
        velocity(parts.transformer, x_t, sigma[:2], ids)


# ------------------------------------------------------------------------- time and size of the grid
FPS = 16.0  # not the tiny model's base_fps (24): latent frames are 24 / 16 = 1.5 time steps apart


def _pipeline_segments(pipe, ids: list[int], latents: torch.Tensor, fps: float) -> tuple[dict, dict]:
    text = pipe._prepare_text_segment(ids, device="cpu")
    vision = pipe._prepare_vision_segment(
        input_vision_tokens=latents, has_image_condition=False, mrope_offset=text["vision_start_temporal_offset"],
        vision_fps=fps, curr=text["und_len"], device="cpu",
    )  # fmt: skip
    return text, vision


def _same(got, expected, what: str) -> None:
    assert got.dtype == expected.dtype, f"{what}: {got.dtype} vs the pipeline's {expected.dtype}"
    assert torch.equal(got, expected), what


def test_two_latent_frames_are_laid_out_as_the_pipeline_lays_them_out_at_another_fps(parts, batch):
    _, _, ids = batch
    pipe = stock_pipeline(parts)
    temporal = vae_temporal_factor(parts.vae.config)
    assert temporal == pipe.vae_scale_factor_temporal  # the pipeline's factor: the preset's config is true
    assert parts.transformer.config.base_fps != FPS and parts.transformer.config.enable_fps_modulation
    x_t = torch.randn(2, 4, 2, 8, 12, generator=torch.Generator().manual_seed(5))  # T = 2, non-square
    sigma = torch.tensor([0.7, 0.3])
    lengths = [ids[0], ids[2]]
    inputs, _ = packed_inputs(parts.transformer.config, x_t[:1], sigma[:1], lengths[:1], fps=FPS, temporal_factor=temporal)
    text, vision = _pipeline_segments(pipe, lengths[0].tolist(), x_t[:1], FPS)
    pipeline_positions = torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"]], dim=1)
    _same(inputs["position_ids"], pipeline_positions, "position_ids")
    frame_step = vision["vision_mrope_ids"][0, 24] - vision["vision_mrope_ids"][0, 0]  # 4 x 6 patches per frame
    assert frame_step == 1.5  # fractional: the fps modulation is really exercised
    _same(inputs["text_indexes"], text["text_indexes"], "text_indexes")
    _same(inputs["vision_sequence_indexes"], vision["vision_sequence_indexes"], "vision_sequence_indexes")
    _same(inputs["vision_mse_loss_indexes"], vision["vision_mse_loss_indexes"], "vision_mse_loss_indexes")
    _same(inputs["vision_noisy_frame_indexes"][0], vision["vision_noisy_frame_indexes"][0], "vision_noisy_frame_indexes")
    _same(inputs["input_ids"], text["input_ids"], "input_ids")
    assert inputs["vision_token_shapes"] == vision["vision_token_shapes"] == [(2, 4, 6)]
    assert inputs["und_len"] == text["und_len"]
    assert inputs["sequence_length"] == text["und_len"] + vision["num_vision_tokens"]
    assert inputs["vision_timesteps"].numel() == vision["num_noisy_vision_tokens"]

    # Packed: the samples' text segments, then their vision segments, each positioned as alone.
    packed, _ = packed_inputs(parts.transformer.config, x_t, sigma, lengths, fps=FPS, temporal_factor=temporal)
    segments = [_pipeline_segments(pipe, i.tolist(), x_t[:1], FPS) for i in lengths]
    expected = torch.cat([t["text_mrope_ids"] for t, _ in segments] + [v["vision_mrope_ids"] for _, v in segments], dim=1)
    _same(packed["position_ids"], expected, "packed position_ids")
    assert packed["vision_token_shapes"] == [(2, 4, 6)] * 2


def test_a_two_frame_sample_at_another_fps_equals_the_stock_pipeline_transformer_call(parts, batch):
    _, _, ids = batch
    reference = build_preset("tiny", seed=0)  # keeps the stock attention processor
    pipe = stock_pipeline(reference)
    x_t = torch.randn(2, 4, 2, 8, 12, generator=torch.Generator().manual_seed(6))
    sigma = torch.tensor([0.9, 0.5])
    temporal = vae_temporal_factor(parts.vae.config)
    with torch.no_grad():
        packed = velocity(parts.transformer, x_t, sigma, [ids[0], ids[1]], fps=FPS, temporal_factor=temporal)
        for i in range(2):
            expected = stock_velocity(pipe, x_t[i : i + 1], PIPELINE_TIMESTEPS[i], ids[i].tolist(), fps=FPS)
            torch.testing.assert_close(packed[i : i + 1], expected, atol=2e-6, rtol=0)
        at_base_fps = velocity(parts.transformer, x_t[:1], sigma[:1], ids[:1], fps=24.0, temporal_factor=temporal)
    assert (at_base_fps - packed[:1]).abs().max() > 1e-4  # the frame rate reaches the model


def test_an_image_is_never_modulated_by_fps(parts, batch):
    x_t, sigma, ids = batch
    with torch.no_grad():
        plain = velocity(parts.transformer, x_t, sigma, ids)
        at_fps = velocity(parts.transformer, x_t, sigma, ids, fps=FPS, temporal_factor=1)
    assert torch.equal(plain, at_fps)
    with pytest.raises(ValueError, match="together"):
        velocity(parts.transformer, x_t, sigma, ids, fps=FPS)
