"""Flow-matching conventions, checked against values worked out by hand."""

import math

import pytest
import torch

from cosmos_rl.core.flow import noisy_latents, uniform_timesteps, velocity_target, x0_from_velocity


def test_noisy_latents_interpolates_per_sample():
    """Two samples, each [1, 2]:
    sample 0: x0 = [2, 4], eps = [10, 20], t = 0.25 -> 0.75*[2,4] + 0.25*[10,20] = [4, 8]
    sample 1: x0 = [0, 8], eps = [4, 0],   t = 0.5  -> 0.5*[0,8]  + 0.5*[4,0]    = [2, 4]
    """
    x0 = torch.tensor([[[2.0, 4.0]], [[0.0, 8.0]]])
    eps = torch.tensor([[[10.0, 20.0]], [[4.0, 0.0]]])
    t = torch.tensor([0.25, 0.5])
    expected = torch.tensor([[[4.0, 8.0]], [[2.0, 4.0]]])
    assert torch.equal(noisy_latents(x0, eps, t), expected)


def test_endpoints_are_data_and_noise():
    """t = 0 gives x0 exactly, t = 1 gives eps exactly."""
    x0 = torch.tensor([[1.0, -2.0], [3.0, 5.0]])
    eps = torch.tensor([[7.0, 9.0], [-1.0, 0.5]])
    out = noisy_latents(x0, eps, torch.tensor([0.0, 1.0]))
    assert torch.equal(out[0], x0[0])
    assert torch.equal(out[1], eps[1])


def test_scalar_t_applies_to_every_sample():
    """t = 0.5 (python float): midpoint of x0 = [0, 2] and eps = [4, 6] is [2, 4]."""
    x0 = torch.tensor([[0.0, 2.0]])
    eps = torch.tensor([[4.0, 6.0]])
    assert torch.equal(noisy_latents(x0, eps, 0.5), torch.tensor([[2.0, 4.0]]))


def test_velocity_target_is_noise_minus_data():
    """v = eps - x0: [10, 20] - [2, 4] = [8, 16]."""
    assert torch.equal(
        velocity_target(torch.tensor([2.0, 4.0]), torch.tensor([10.0, 20.0])),
        torch.tensor([8.0, 16.0]),
    )


def test_x0_from_velocity_inverts_the_forward_process():
    """With the true velocity the clean sample is recovered exactly:
    x0 = [2, 4], eps = [10, 20], t = 0.25: x_t = [4, 8], v = [8, 16],
    x_t - t*v = [4 - 2, 8 - 4] = [2, 4].
    """
    x0 = torch.tensor([[2.0, 4.0]])
    eps = torch.tensor([[10.0, 20.0]])
    t = torch.tensor([0.25])
    x_t = noisy_latents(x0, eps, t)
    v = velocity_target(x0, eps)
    assert torch.equal(x0_from_velocity(x_t, t, v), x0)


def test_x0_from_velocity_broadcasts_t_per_sample_over_4d_latents():
    """x_t all 1, v all 2, t = [0, 0.5]: sample 0 stays 1, sample 1 becomes 1 - 0.5*2 = 0."""
    x_t = torch.ones(2, 3, 2, 2)
    v = torch.full((2, 3, 2, 2), 2.0)
    out = x0_from_velocity(x_t, torch.tensor([0.0, 0.5]), v)
    assert torch.equal(out[0], torch.ones(3, 2, 2))
    assert torch.equal(out[1], torch.zeros(3, 2, 2))


def test_t_with_wrong_batch_size_is_rejected():
    with pytest.raises(ValueError, match="shape"):
        noisy_latents(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0.1, 0.2, 0.3]))


def test_uniform_timesteps_are_reproducible_and_in_range():
    a = uniform_timesteps(1000, torch.Generator().manual_seed(7))
    b = uniform_timesteps(1000, torch.Generator().manual_seed(7))
    c = uniform_timesteps(1000, torch.Generator().manual_seed(8))
    assert a.shape == (1000,)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.min() >= 0.0 and a.max() < 1.0
    # U[0,1) has mean 1/2; 1000 draws put the sample mean within ~0.05 of it.
    assert abs(a.mean().item() - 0.5) < 0.05


def test_training_timesteps_uniform_is_the_draw_of_before_and_logit_normal_by_hand():
    from types import SimpleNamespace

    from cosmos_rl.core.flow import training_timesteps
    from cosmos_rl.trainers.dpo import DPOTrainer

    # uniform: the one torch.rand draw DPO and SFT made before rl.timestep_sampling existed
    assert torch.equal(training_timesteps(64, torch.Generator().manual_seed(3)), torch.rand(64, generator=torch.Generator().manual_seed(3)))
    # logit_normal with a vanishing std: t = sigmoid(mean); mean = ln 3 -> 3 / (3 + 1) = 0.75, mean = 0 -> 0.5
    t = training_timesteps(8, torch.Generator().manual_seed(0), "logit_normal", math.log(3.0), 1e-9)
    assert torch.allclose(t, torch.full((8,), 0.75), atol=1e-6)
    # mean 0, std 1: sigmoid of a standard normal draw, 1 / (1 + exp(-z)) per sample
    z = torch.randn(5, generator=torch.Generator().manual_seed(1)).tolist()
    t = training_timesteps(5, torch.Generator().manual_seed(1), "logit_normal", 0.0, 1.0).tolist()
    assert t == pytest.approx([1 / (1 + math.exp(-v)) for v in z], rel=1e-6)
    # symmetric about 0.5: the median of many draws is sigmoid(0) = 0.5, none at the ends
    many = training_timesteps(20000, torch.Generator().manual_seed(2), "logit_normal")
    assert abs(float(many.median()) - 0.5) < 0.02 and 0 < float(many.min()) and float(many.max()) < 1
    with pytest.raises(ValueError, match="timestep_sampling"):
        training_timesteps(1, torch.Generator(), "cosine")
    with pytest.raises(ValueError, match="logit_std"):
        training_timesteps(1, torch.Generator(), "logit_normal", 0.0, 0.0)
    # DPO's draw of a step takes the knob: eps first, then t, from one generator
    rl = SimpleNamespace(timestep_sampling="logit_normal", logit_mean=math.log(3.0), logit_std=1e-9)
    eps, t = DPOTrainer._draw(SimpleNamespace(rl=rl, device="cpu"), (4, 2), "dpo", 0, 1)
    assert eps.shape == (4, 2) and torch.allclose(t, torch.full((4,), 0.75), atol=1e-6)
