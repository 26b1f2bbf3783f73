"""Batched UniPC sampling with native CFG agrees with the diffusers pipeline loaded from the same folder."""

from __future__ import annotations

import functools

import pytest
import torch
from _models_helpers import NANO_HEADS, folder_pipeline, nano_folder

from cosmos_rl.core.flow import model_timesteps
from cosmos_rl.models.build import build_preset, flow_scheduler, load_parts
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.sampling import consistent_sigmas, rollout_scheduler, sample_latents
from cosmos_rl.models.text import tokenize_prompts

STEPS, SHIFT = 8, 3.0


@pytest.fixture(scope="module")
def parts():
    return build_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def noise():
    return torch.randn(2, 4, 1, 8, 8, generator=torch.Generator().manual_seed(3))


class CountingVelocity:
    """Wraps a velocity function, recording each call's batch size."""

    def __init__(self, fn):
        self.fn, self.batch_sizes = fn, []

    def __call__(self, x_t, sigma, ids):
        self.batch_sizes.append(x_t.shape[0])
        return self.fn(x_t, sigma, ids)


PROMPTS = ["a red cube", "a much longer prompt about a dog on a red sofa", "x", "a blue sphere"]
# Max |latent difference| allowed against the stock pipeline: float noise of packed vs stock attention.
PARITY = 2e-6


def _pipeline_latents(pipe, prompt, noise, guidance, steps=STEPS):
    out = pipe(
        prompt=prompt, num_frames=1, height=32, width=32, num_inference_steps=steps,
        guidance_scale=guidance, latents=noise[None], output_type="latent",
    ).video  # fmt: skip
    return out


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    """A Nano-layout folder (sound/action heads in the transformer) whose scheduler is not the default."""
    return nano_folder(tmp_path_factory.mktemp("nano") / "pipe", seed=5, solver_order=3, flow_shift=SHIFT)


@pytest.fixture(scope="module")
def nano_parts(nano):
    return load_parts(nano, skip_keys=NANO_HEADS)


@pytest.mark.parametrize("prompts", [1, 4])
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_packed_rollouts_match_the_stock_pipeline_from_the_folder(nano, nano_parts, prompts, guidance):
    # The folder's own scheduler (solver_order 3, flow_shift 3: shift None keeps it), the folder's
    # weights in a T2I model without the heads, the pipeline's integer timesteps: the stock
    # pipeline loaded from the same folder, one prompt per call, gives the same latents.
    parts, pipe = nano_parts, folder_pipeline(nano)
    noise = torch.randn(prompts, 4, 1, 8, 8, generator=torch.Generator().manual_seed(11))
    cond, uncond = tokenize_prompts(parts.tokenizer, PROMPTS[:prompts], resolution=(32, 32))
    got, _ = sample_latents(
        functools.partial(velocity, parts.transformer), noise, cond, uncond, STEPS, None, guidance, parts=parts
    )
    with torch.no_grad():
        expected = torch.cat([_pipeline_latents(pipe, PROMPTS[i], noise[i], guidance) for i in range(prompts)])
    assert (got - expected).abs().max() <= PARITY


@pytest.mark.parametrize("native", [False, True])
def test_rollouts_match_where_float32_sigmas_floor_to_another_integer(tmp_path, native):
    # Shift 1 with 9 steps: several of the scheduler's float32 sigmas floor to one below (or above)
    # its float64 integer timesteps; the rollout still feeds the model the scheduler's integers.
    # The native flow schedule (model_index.json use_native_flow_schedule) is the pipeline's too.
    folder = nano_folder(tmp_path / "pipe", seed=2, native_flow_schedule=native, flow_shift=1.0)
    parts = load_parts(folder, skip_keys=NANO_HEADS)
    assert parts.native_flow_schedule is native
    raw = rollout_scheduler(9, None, parts)
    assert not torch.equal(model_timesteps(raw.sigmas[:9], 1000), raw.timesteps)  # the case is real
    noise = torch.randn(1, 4, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    cond, uncond = tokenize_prompts(parts.tokenizer, PROMPTS[:1], resolution=(32, 32))
    got, sigmas = sample_latents(
        functools.partial(velocity, parts.transformer), noise, cond, uncond, 9, None, 3.0, parts=parts
    )
    assert torch.equal(model_timesteps(sigmas, 1000), raw.timesteps)
    with torch.no_grad():
        expected = _pipeline_latents(folder_pipeline(folder), PROMPTS[0], noise[0], 3.0, steps=9)
    assert (got - expected).abs().max() <= PARITY


def test_the_manifest_shift_overrides_only_the_folder_shift(nano_parts):
    parts = nano_parts
    own, overridden = rollout_scheduler(STEPS, None, parts), rollout_scheduler(STEPS, 5.0, parts)
    assert (own.config.flow_shift, own.config.solver_order) == (SHIFT, 3)
    assert (overridden.config.flow_shift, overridden.config.solver_order) == (5.0, 3)
    assert parts.scheduler.config.flow_shift == SHIFT  # the model's own template is left alone


def test_consistent_sigmas_move_only_as_far_as_the_integer_needs():
    # float32(0.7) = 0.69999999 floors to 699; a scheduler that says 700 gets the next float up.
    sigma = torch.tensor([0.7, 0.5])
    moved = consistent_sigmas(sigma, torch.tensor([700, 500]), 1000)
    assert model_timesteps(moved, 1000).tolist() == [700, 500]
    assert moved[0] == torch.nextafter(sigma[0], torch.tensor(1.0)) and moved[1] == sigma[1]
    assert torch.equal(consistent_sigmas(sigma, torch.tensor([699, 500]), 1000), sigma)


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
