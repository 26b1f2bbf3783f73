"""Batched UniPC sampling with native CFG agrees with the diffusers pipeline."""

from __future__ import annotations

import functools

import pytest
import torch
from _models_helpers import stock_pipeline

from cosmos_rl.models.build import build_preset, flow_scheduler
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.sampling import sample_latents
from cosmos_rl.models.text import tokenize_prompts

STEPS, SHIFT = 8, 3.0


@pytest.fixture(scope="module")
def parts():
    return build_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def stock_parts():
    return build_preset("tiny", seed=0)  # a separate copy keeps the stock attention processor


@pytest.fixture(scope="module")
def noise():
    return torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(3))


class CountingVelocity:
    """Wraps a velocity function, recording each call's batch size."""

    def __init__(self, fn):
        self.fn, self.batch_sizes = fn, []

    def __call__(self, x_t, sigma, ids):
        self.batch_sizes.append(x_t.shape[0])
        return self.fn(x_t, sigma, ids)


def _with_pipeline_timesteps(velocity_fn):
    """The pipeline feeds the model int(1000 * sigma) / 1000 (UniPC's timesteps are int64);
    give the model that same quantised time so the comparison isolates everything else."""
    scheduler = flow_scheduler(SHIFT)
    scheduler.set_timesteps(STEPS)

    def quantised(x_t, sigma, ids):
        index = (scheduler.sigmas[:STEPS] - sigma[0]).abs().argmin()
        return velocity_fn(x_t, torch.full_like(sigma, scheduler.timesteps[index].item() / 1000.0), ids)

    return quantised


def _pipeline_latents(stock_parts, prompt, noise, guidance):
    pipe = stock_pipeline(stock_parts, shift=SHIFT)
    out = pipe(
        prompt=prompt, num_frames=1, height=32, width=32, num_inference_steps=STEPS,
        guidance_scale=guidance, latents=noise[None, :, None], output_type="latent",
    ).video  # fmt: skip
    return out[:, :, 0]


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_matches_the_pipeline_for_one_prompt(parts, stock_parts, noise, guidance):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a red cube"], resolution=(32, 32))
    expected = _pipeline_latents(stock_parts, "a red cube", noise[0], guidance)
    fn = _with_pipeline_timesteps(functools.partial(velocity, parts.transformer))
    got, _ = sample_latents(fn, noise[:1], cond, uncond, STEPS, SHIFT, guidance)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # With the exact (unquantised) sigma the model sees a time at most 0.001 off: still close.
    exact, _ = sample_latents(
        functools.partial(velocity, parts.transformer), noise[:1], cond, uncond, STEPS, SHIFT, guidance
    )
    torch.testing.assert_close(exact, expected, atol=2e-3, rtol=0)


def test_returns_the_scheduler_sigmas_the_model_was_called_at(parts, noise):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a", "b"])
    seen = []

    def recording(x_t, sigma, ids):
        seen.append(sigma.clone())
        return velocity(parts.transformer, x_t, sigma, ids)

    _, sigmas = sample_latents(recording, noise, cond, uncond, STEPS, SHIFT, 2.0)
    reference = flow_scheduler(SHIFT)
    reference.set_timesteps(STEPS)
    assert sigmas.shape == (STEPS,)
    torch.testing.assert_close(sigmas, reference.sigmas[:STEPS])
    assert all(torch.all(s == sigmas[i]) for i, s in enumerate(seen))
    assert sigmas[0] > 0.99 and torch.all(sigmas[1:] < sigmas[:-1])


def test_guidance_one_skips_the_unconditional_forward(parts, noise):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a", "b"])
    counting = CountingVelocity(functools.partial(velocity, parts.transformer))
    guided_one, _ = sample_latents(counting, noise, cond, uncond, STEPS, SHIFT, 1.0)
    assert counting.batch_sizes == [2] * STEPS
    # Conditional-only sampling, written out: plain UniPC steps on v_cond.
    scheduler = flow_scheduler(SHIFT)
    scheduler.set_timesteps(STEPS)
    x = noise.clone()
    for index, timestep in enumerate(scheduler.timesteps):
        v = velocity(parts.transformer, x, scheduler.sigmas[index].expand(2), cond)
        x = scheduler.step(v, timestep, x, return_dict=False)[0]
    torch.testing.assert_close(guided_one, x, atol=1e-6, rtol=0)


def test_cfg_packs_cond_and_uncond_into_one_forward(parts, noise):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a", "b"])
    counting = CountingVelocity(functools.partial(velocity, parts.transformer))
    sample_latents(counting, noise, cond, uncond, STEPS, SHIFT, 3.0)
    assert counting.batch_sizes == [4] * STEPS


def test_a_batch_samples_like_each_prompt_alone(parts, noise):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a small red cube", "b"], resolution=(32, 32))
    fn = functools.partial(velocity, parts.transformer)
    batched, _ = sample_latents(fn, noise, cond, uncond, STEPS, SHIFT, 3.0)
    for i in range(2):
        alone, _ = sample_latents(fn, noise[i : i + 1], cond[i : i + 1], uncond[i : i + 1], STEPS, SHIFT, 3.0)
        torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=0)


def test_guidance_changes_the_result(parts, noise):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a", "b"])
    fn = functools.partial(velocity, parts.transformer)
    plain, _ = sample_latents(fn, noise, cond, uncond, STEPS, SHIFT, 1.0)
    guided, _ = sample_latents(fn, noise, cond, uncond, STEPS, SHIFT, 5.0)
    assert (plain - guided).abs().max() > 1e-3
