"""Flow-GRPO's math, checked by hand: the SDE step, log-prob, ratio, clip, KL, advantages, the step
choices, and the SDE sampler's marginals against the ODE's on a Gaussian target."""

import math

import pytest
import torch

from cosmos_rl.algorithms.grpo import (
    STEP_DYNAMICS,
    clipped_surrogate,
    cps_step_mean_std,
    ema_warmup_decay,
    gaussian_kl,
    grpo_advantages,
    grpo_step_loss,
    policy_ratio,
    sde_sigma,
    sde_step,
    sde_step_mean_std,
    step_log_prob,
    step_kl,
    step_mean_std,
)
from cosmos_rl.algorithms.grpo_sampler import (
    default_sde_steps,
    draw_window_start,
    sample_sde,
    sde_window,
    train_steps,
)

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)  # 0.9189385


# ----------------------------------------------------------------------------------- SDE step
def test_noise_level_by_hand_and_the_endpoint_rule():
    """a = 0.5, sigma_s = a * sqrt(s / max(1 - s, s - s')):
    (0.5, 0.25): max(0.5, 0.25) = 0.5 -> 0.5 * sqrt(1) = 0.5 (the paper's formula)
    (0.3, 0.2):  max(0.7, 0.1) = 0.7 -> 0.5 * sqrt(3/7) = 0.3273268 (the paper's formula)
    (0.9, 0.8):  max(0.1, 0.1) -> 0.5 * sqrt(9) = 1.5 (a uniform schedule's second step: unchanged)
    (1, 0.75):   1 - s = 0, floored at the step 0.25 -> 0.5 * sqrt(4) = 1 (Flow-GRPO's 1 - s' rule)
    (0.99, 0.74): floored at 0.25 -> 0.5 * sqrt(3.96) = 0.9949874, where the unfloored formula
    gives 0.5 * sqrt(99) = 4.97: a schedule starting just below 1 gets the bounded step too."""
    s = torch.tensor([0.5, 0.3, 0.9, 1.0, 0.99], dtype=torch.float64)
    s_next = torch.tensor([0.25, 0.2, 0.8, 0.75, 0.74], dtype=torch.float64)
    got = sde_sigma(s, s_next, 0.5)
    expected = torch.tensor([0.5, 0.3273268, 1.5, 1.0, 0.9949874], dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-7)
    with pytest.raises(ValueError, match="next sigma"):
        sde_sigma(torch.tensor([0.5]), torch.tensor([0.5]), 0.7)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sde_sigma(torch.tensor([1.5]), torch.tensor([0.5]), 0.7)
    with pytest.raises(ValueError, match="noise level"):
        sde_sigma(torch.tensor([0.5]), torch.tensor([0.2]), -0.1)


def test_sde_step_mean_and_std_by_hand_per_sample_sigmas():
    """a = 0.5, x = 2, v = 1, eps_hat = x + (1 - s) v, mean = x + dt (v + sigma^2/(2s) eps_hat):
    sample 0, s = 0.5 -> 0.25: sigma 0.5, eps_hat 2.5, drift 1 + 0.25 * 2.5 = 1.625,
        mean = 2 - 0.25 * 1.625 = 1.59375, std = 0.5 * sqrt(0.25) = 0.25
    sample 1, s = 1 -> 0.75 (endpoint): sigma 1, eps_hat = x = 2, drift 1 + 0.5 * 2 = 2,
        mean = 2 - 0.25 * 2 = 1.5, std = 1 * sqrt(0.25) = 0.5
    sde_step with noise [1, -2]: x_next = [1.59375 + 0.25, 1.5 - 1.0] = [1.84375, 0.5]."""
    x = torch.full((2, 1, 1), 2.0)
    v = torch.ones(2, 1, 1)
    s, s_next = torch.tensor([0.5, 1.0]), torch.tensor([0.25, 0.75])
    mean, std = sde_step_mean_std(x, v, s, s_next, 0.5)
    assert torch.allclose(mean.flatten(), torch.tensor([1.59375, 1.5]))
    assert torch.allclose(std, torch.tensor([0.25, 0.5])) and std.shape == (2,)
    x_next, mean2, std2 = sde_step(x, v, s, s_next, 0.5, torch.tensor([1.0, -2.0]).reshape(2, 1, 1))
    assert torch.allclose(x_next.flatten(), torch.tensor([1.84375, 0.5]))
    assert torch.equal(mean2, mean) and torch.equal(std2, std)
    with pytest.raises(ValueError, match="sigma must be a scalar"):
        sde_step_mean_std(x, v, torch.tensor([0.5, 0.5, 0.5]), 0.25, 0.5)


def test_zero_noise_level_is_the_euler_ode_step_exactly():
    """a = 0: sigma 0, so mean = x + dt * (v + 0) = x + (s' - s) v bit for bit, std 0; any noise
    leaves x_next = mean."""
    gen = torch.Generator().manual_seed(1)
    x, v = torch.randn(3, 4, 1, 2, 2, generator=gen), torch.randn(3, 4, 1, 2, 2, generator=gen)
    s, s_next = torch.tensor(0.7), torch.tensor(0.6)
    mean, std = sde_step_mean_std(x, v, s, s_next, 0.0)
    assert torch.equal(mean, x + (s_next - s) * v)
    assert torch.equal(std, torch.zeros(3))
    x_next, _, _ = sde_step(x, v, s, s_next, 0.0, torch.randn(x.shape, generator=gen))
    assert torch.equal(x_next, mean)


# ----------------------------------------------------------------------------------- CPS step
def test_cps_step_mean_and_std_by_hand_and_the_gradient_into_the_velocity():
    """s = 0.5 -> s' = 0.25, x = 2, v = 1: x0_hat = x - s v = 1.5, eps_hat = x + (1 - s) v = 2.5.
    eta = 1: std = s' sin(pi/2) = 0.25, mean = (1 - s') x0_hat + s' cos(pi/2) eps_hat = 1.125.
    eta = 1/3: std = 0.25 * sin(pi/6) = 0.125, mean = 1.125 + 0.25 * 0.8660254 * 2.5 = 1.6662659.
    Take x_next = mean + std = 1.7912659: logp = -1/2 - log 0.125 - 0.9189385 = 0.6605030;
    d logp / d mean = std / std^2 = 8; d mean / d v = -(1 - s') s + s' cos(pi/6) (1 - s)
    = -0.375 + 0.1082532 = -0.2667468; so d logp / d v = -2.1339746."""
    x = torch.tensor([[2.0]])
    mean, std = cps_step_mean_std(x, torch.tensor([[1.0]]), 0.5, 0.25, 1.0)
    assert mean.item() == pytest.approx(1.125) and std.tolist() == [0.25]
    v = torch.tensor([[1.0]], requires_grad=True)
    mean, std = cps_step_mean_std(x, v, 0.5, 0.25, 1 / 3)
    assert mean.item() == pytest.approx(1.6662659, abs=1e-6) and std.item() == pytest.approx(0.125)
    logp = step_log_prob(torch.tensor([[1.7912659]]), mean, std)
    assert logp.item() == pytest.approx(0.6605030, abs=1e-5)
    logp.backward()
    assert v.grad.item() == pytest.approx(-2.1339746, abs=1e-5)
    # the dispatch the trainer and sampler use picks the same function
    assert STEP_DYNAMICS["cps"] is cps_step_mean_std
    assert torch.equal(step_mean_std("cps", x, torch.tensor([[1.0]]), 0.5, 0.25, 1.0)[0], torch.tensor([[1.125]]))
    with pytest.raises(ValueError, match="unknown step dynamics"):
        step_mean_std("ddim", x, x, 0.5, 0.25, 1.0)


def test_cps_near_zero_eta_is_the_euler_step_and_its_bounds_are_refused():
    """(1 - s')(x - s v) + s' (x + (1 - s) v) = x + (s' - s) v: at eta -> 0 the CPS step is the
    Euler ODE step (within float rounding and cos(eta pi / 2) = 1 - O(eta^2)). A step to s' = 0 has
    no noise (no log-prob) and eta outside (0, 1] is no CPS step: both refused."""
    gen = torch.Generator().manual_seed(3)
    x, v = torch.randn(3, 4, 2, 2, generator=gen), torch.randn(3, 4, 2, 2, generator=gen)
    mean, std = cps_step_mean_std(x, v, 0.7, 0.6, 1e-6)
    assert torch.allclose(mean, x + (0.6 - 0.7) * v, atol=1e-6) and float(std.max()) < 1e-5
    with pytest.raises(ValueError, match="a step to 0 has no noise"):
        cps_step_mean_std(x, v, 0.2, 0.0, 0.8)
    for eta in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="eta must be in"):
            cps_step_mean_std(x, v, 0.7, 0.6, eta)


# ------------------------------------------------------------------------------------ log-prob
def test_step_log_prob_by_hand_and_its_gradient():
    """x_next = [1, 0], mean = [0.5, 0.5], std = 0.5: each element has (x - m)^2 = 0.25, so
    logp = -0.25/(2 * 0.25) - log 0.5 - 0.9189385 = -0.5 + 0.6931472 - 0.9189385 = -0.7257914
    (MEAN over the 2 elements, the same for both). d logp / d mean_i = (x_i - m_i) / (std^2 * 2)
    = [0.5, -0.5] / 0.5 = [1, -1]; x_next gets no gradient (the taken action is a constant).
    The value agrees with torch.distributions.Normal's log_prob averaged over the elements."""
    x_next = torch.tensor([[1.0, 0.0]], requires_grad=True)
    mean = torch.tensor([[0.5, 0.5]], requires_grad=True)
    logp = step_log_prob(x_next, mean, torch.tensor([0.5]))
    assert logp.shape == (1,) and logp.item() == pytest.approx(-0.7257914, abs=1e-6)
    normal = torch.distributions.Normal(mean.detach(), 0.5).log_prob(x_next.detach()).mean()
    assert logp.item() == pytest.approx(normal.item(), abs=1e-6)
    logp.sum().backward()
    assert torch.allclose(mean.grad, torch.tensor([[1.0, -1.0]]))
    assert x_next.grad is None
    with pytest.raises(ValueError, match="ODE step"):
        step_log_prob(x_next, mean, torch.tensor([0.0]))


def test_log_prob_gradient_reaches_the_velocity_through_the_step_mean():
    """The by-hand step (a = 0.5, s = 0.5 -> 0.25, x = 2, v = 1): mean 1.59375, std 0.25; take
    x_next = mean + std = 1.84375. logp = -1/2 - log 0.25 - 0.9189385 = -0.0326442.
    d logp / d mean = (x_next - mean) / std^2 = 0.25 / 0.0625 = 4;
    d mean / d v = dt * (1 + sigma^2 (1 - s) / (2 s)) = -0.25 * (1 + 0.25 * 0.5) = -0.28125;
    so d logp / d v = 4 * -0.28125 = -1.125."""
    v = torch.tensor([[1.0]], requires_grad=True)
    mean, std = sde_step_mean_std(torch.tensor([[2.0]]), v, 0.5, 0.25, 0.5)
    logp = step_log_prob(torch.tensor([[1.84375]]), mean, std)
    assert logp.item() == pytest.approx(-0.0326442, abs=1e-6)
    logp.backward()
    assert v.grad.item() == pytest.approx(-1.125, abs=1e-6)


# ---------------------------------------------------------------------------- ratio and clip
def test_ratio_is_exp_of_the_log_prob_difference_with_old_detached():
    """logp_new = [0, log 2], logp_old = [log 2, 0] -> ratio [1/2, 2]; old gets no gradient."""
    new = torch.tensor([0.0, math.log(2)], requires_grad=True)
    old = torch.tensor([math.log(2), 0.0], requires_grad=True)
    ratio = policy_ratio(new, old)
    assert torch.allclose(ratio, torch.tensor([0.5, 2.0]))
    ratio.sum().backward()
    assert torch.allclose(new.grad, torch.tensor([0.5, 2.0])) and old.grad is None


def test_clip_inside_outside_and_both_advantage_signs():
    """clip_range 0.2 (band [0.8, 1.2]), logp_old = 0, logp_new = log r, r = [1.1, 1.5, 0.5, 1.5,
    0.5, 0.9], A = [1, 1, 1, -1, -1, -1]. Per sample max(-A r, -A clip(r)):
      A=+1 r=1.1 inside -> -1.1 (gradient)    A=-1 r=1.5 above -> max(1.5, 1.2) = 1.5 (gradient)
      A=+1 r=1.5 above  -> max(-1.5, -1.2) = -1.2 (clipped)    A=-1 r=0.5 below -> max(0.5, 0.8) = 0.8 (clipped)
      A=+1 r=0.5 below  -> max(-0.5, -0.8) = -0.5 (gradient)   A=-1 r=0.9 inside -> 0.9 (gradient)
    policy_loss = (-1.1 - 1.2 - 0.5 + 1.5 + 0.8 + 0.9) / 6 = 0.4 / 6 = 0.0666667.
    d loss / d logp_new_i = (1/6) * (-A_i) * r_i where not clipped, else 0:
      [-1.1, 0, -0.5, 1.5, 0, 0.9] / 6 = [-0.1833333, 0, -0.0833333, 0.25, 0, 0.15].
    clip_fraction: |r - 1| > 0.2 for 1.5, 0.5, 1.5, 0.5 -> 4/6; ratio_mean = 6/6 = 1;
    approx_kl = 0.5 * mean(log(r)^2) = 0.5 * (0.0090840 + 0.1644020 + 0.4804530 + 0.1644020
    + 0.4804530 + 0.0111008) / 6 = 0.1091579. No kl given: the loss is the policy loss, no kl_loss."""
    r = torch.tensor([1.1, 1.5, 0.5, 1.5, 0.5, 0.9], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    logp_new = r.log().requires_grad_()
    loss, m = grpo_step_loss(logp_new, torch.zeros(6, dtype=torch.float64), adv, None, clip_range=0.2, kl_beta=0.0)
    assert loss.item() == pytest.approx(0.4 / 6)
    assert m["policy_loss"].item() == pytest.approx(0.4 / 6) and "kl_loss" not in m
    assert m["clip_fraction"].item() == pytest.approx(4 / 6)
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["approx_kl"].item() == pytest.approx(0.1091579, abs=1e-6)
    assert all(t.dim() == 0 and not t.requires_grad for t in m.values())
    loss.backward()
    expected = torch.tensor([-1.1, 0.0, -0.5, 1.5, 0.0, 0.9], dtype=torch.float64) / 6
    assert torch.allclose(logp_new.grad, expected)
    per_sample = clipped_surrogate(r, adv, 0.2)
    assert torch.allclose(per_sample, torch.tensor([-1.1, -1.2, -0.5, 1.5, 0.8, 0.9], dtype=torch.float64))


def test_asymmetric_clip_widens_only_the_upper_bound():
    """clip_range 0.2, clip_range_high 0.6 (band [0.8, 1.6]); r = [1.5, 1.7, 0.5, 1.5], A = [1, 1, 1, -1].
    Per sample max(-A r, -A clip(r)): A=+1 r=1.5 now inside -> -1.5 (gradient; the symmetric band
    would clip it to -1.2); A=+1 r=1.7 above -> max(-1.7, -1.6) = -1.6 (clipped); A=+1 r=0.5 below ->
    max(-0.5, -0.8) = -0.5; A=-1 r=1.5 inside -> 1.5. clip_fraction: 1.7 and 0.5 outside -> 2/4.
    d loss / d logp_i = (1/4)(-A_i r_i) where not clipped: [-1.5, 0, -0.5, 1.5] / 4."""
    r = torch.tensor([1.5, 1.7, 0.5, 1.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    assert torch.allclose(clipped_surrogate(r, adv, 0.2, 0.6), torch.tensor([-1.5, -1.6, -0.5, 1.5], dtype=torch.float64))
    assert torch.allclose(clipped_surrogate(r, adv, 0.2, None), clipped_surrogate(r, adv, 0.2))  # unset: symmetric
    logp_new = r.log().requires_grad_()
    loss, m = grpo_step_loss(logp_new, torch.zeros(4, dtype=torch.float64), adv, None, clip_range=0.2, kl_beta=0.0, clip_range_high=0.6)
    assert loss.item() == pytest.approx((-1.5 - 1.6 - 0.5 + 1.5) / 4)
    assert m["clip_fraction"].item() == pytest.approx(2 / 4)
    loss.backward()
    assert torch.allclose(logp_new.grad, torch.tensor([-1.5, 0.0, -0.5, 1.5], dtype=torch.float64) / 4)
    with pytest.raises(ValueError, match="clip_range_high"):
        clipped_surrogate(r, adv, 0.2, 0.0)


def test_ema_warmup_decay_by_hand():
    """min((1 + t) / (10 + t), decay): t = 0 -> 0.1, 8 -> 0.5, 80 -> 81/90 = 0.9, capped by decay 0.9
    from there; decay 0.5 caps t = 8 at 0.5 and t = 20 (21/30 = 0.7) at 0.5."""
    assert ema_warmup_decay(0, 0.9) == pytest.approx(0.1)
    assert ema_warmup_decay(8, 0.9) == pytest.approx(0.5)
    assert ema_warmup_decay(80, 0.9) == pytest.approx(0.9)
    assert ema_warmup_decay(1000, 0.9) == 0.9
    assert ema_warmup_decay(20, 0.5) == 0.5
    with pytest.raises(ValueError):
        ema_warmup_decay(-1, 0.9)


def test_step_loss_adds_the_weighted_kl():
    """ratio 1 (inside any clip), A = [1, -1]: surrogate [-1, 1], policy_loss 0; kl = [0.5, 1.5],
    kl_loss = 1, kl_beta = 0.04 -> loss = 0.04. d loss / d kl_i = 0.04 / 2 = 0.02;
    d loss / d logp_new_i = -A_i * 1 / 2 = [-0.5, 0.5]. kl = None with kl_beta > 0 is refused."""
    logp = torch.zeros(2, requires_grad=True)
    kl = torch.tensor([0.5, 1.5], requires_grad=True)
    loss, m = grpo_step_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), kl, clip_range=1e-4, kl_beta=0.04)
    assert loss.item() == pytest.approx(0.04)
    assert m["kl_loss"].item() == pytest.approx(1.0) and m["policy_loss"].item() == pytest.approx(0.0)
    assert m["clip_fraction"].item() == 0.0 and m["approx_kl"].item() == 0.0
    loss.backward()
    assert torch.allclose(kl.grad, torch.tensor([0.02, 0.02]))
    assert torch.allclose(logp.grad, torch.tensor([-0.5, 0.5]))
    with pytest.raises(ValueError, match="kl is needed"):
        grpo_step_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), None, kl_beta=0.04)


# -------------------------------------------------------------------------------------- KL
def test_gaussian_kl_by_hand_its_gradient_and_torch_distributions():
    """mean [1, 3], mean_ref [0, 1], std 2: ((1)^2 + (2)^2) / 2 / (2 * 4) = 2.5 / 8 = 0.3125.
    d/d mean_i = (m_i - ref_i) / (std^2 * 2) = [1, 2] / 8 = [0.125, 0.25]; the reference gets none.
    It is the exact KL of the two Gaussians (torch.distributions, averaged over the elements).
    Dividing std by sqrt(0.25) (Flow-GRPO's code's sigma_s for a step of 0.25) gives 0.25x."""
    mean = torch.tensor([[1.0, 3.0]], requires_grad=True)
    ref = torch.tensor([[0.0, 1.0]], requires_grad=True)
    kl = gaussian_kl(mean, ref, torch.tensor([2.0]))
    assert kl.item() == pytest.approx(0.3125)
    exact = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean.detach(), 2.0), torch.distributions.Normal(ref.detach(), 2.0)
    ).mean()
    assert kl.item() == pytest.approx(exact.item())
    kl.backward()
    assert torch.allclose(mean.grad, torch.tensor([[0.125, 0.25]])) and ref.grad is None
    assert gaussian_kl(mean, ref, torch.tensor([4.0])).item() == pytest.approx(0.25 * 0.3125)


def test_kl_of_two_steps_matches_the_papers_closed_form_in_velocities():
    """Same x, velocities v and v_ref one apart: the means differ by dt (1 + sigma^2 (1-s)/(2s)),
    so KL = (s - s')/2 * (sigma (1-s)/(2s) + 1/sigma)^2 * (v - v_ref)^2 (Flow-GRPO's closed form).
    s = 0.5 -> 0.25, a = 0.5: sigma 0.5, (0.5 * 0.5 / 1 + 2)^2 = 5.0625, * 0.25/2 -> 0.6328125;
    directly: mean difference 0.28125, std 0.25, 0.28125^2 / (2 * 0.0625) = 0.6328125."""
    x = torch.tensor([[0.3]])
    mean, std = sde_step_mean_std(x, torch.tensor([[1.0]]), 0.5, 0.25, 0.5)
    mean_ref, _ = sde_step_mean_std(x, torch.tensor([[0.0]]), 0.5, 0.25, 0.5)
    assert gaussian_kl(mean, mean_ref, std).item() == pytest.approx(0.6328125, abs=1e-6)


def test_step_kl_exact_and_reference_forms_by_hand():
    """The step of the test above (x = 0.3, s = 0.5 -> 0.25, a = 0.5, v = 1 vs v_ref = 0):
    exact KL = 0.28125^2 / (2 * 0.25^2) = 0.6328125 (std = sigma_s sqrt(s - s') = 0.5 * 0.5).
    Flow-GRPO's code divides by sigma_s^2 = 0.25 instead of std^2 = 0.0625:
    0.28125^2 / (2 * 0.25) = 0.158203125 = 0.6328125 * (s - s') = 0.6328125 * 0.25.
    The CPS step: the reference's std_dev_t is the step's own std, so the two forms agree:
    x = 2, s = 0.5 -> 0.25, eta = 1, v = 1 vs v_ref = 0: means 0.75 * 1.5 = 1.125 and
    0.75 * 2 = 1.5 (x0_hat = x - s v), std 0.25, KL = 0.375^2 / (2 * 0.0625) = 1.125 in both."""
    x = torch.tensor([[0.3]], dtype=torch.float64)
    mean, std = sde_step_mean_std(x, torch.tensor([[1.0]], dtype=torch.float64), 0.5, 0.25, 0.5)
    mean_ref, _ = sde_step_mean_std(x, torch.tensor([[0.0]], dtype=torch.float64), 0.5, 0.25, 0.5)
    s, s_next = torch.tensor(0.5, dtype=torch.float64), torch.tensor(0.25, dtype=torch.float64)
    assert step_kl(mean, mean_ref, std, s, s_next).item() == pytest.approx(0.6328125, rel=1e-12)  # exact: the default
    assert step_kl(mean, mean_ref, std, s, s_next, "exact").item() == pytest.approx(0.6328125, rel=1e-12)
    assert step_kl(mean, mean_ref, std, s, s_next, "reference").item() == pytest.approx(0.158203125, rel=1e-12)
    x = torch.tensor([[2.0]], dtype=torch.float64)
    mean, std = cps_step_mean_std(x, torch.tensor([[1.0]], dtype=torch.float64), 0.5, 0.25, 1.0)
    mean_ref, _ = cps_step_mean_std(x, torch.tensor([[0.0]], dtype=torch.float64), 0.5, 0.25, 1.0)
    for form in ("exact", "reference"):
        assert step_kl(mean, mean_ref, std, 0.5, 0.25, form, "cps").item() == pytest.approx(1.125, rel=1e-12)
    with pytest.raises(ValueError, match="kl_form"):
        step_kl(mean, mean_ref, std, 0.5, 0.25, "paper")


# ------------------------------------------------------------------------------- advantages
def test_group_advantages_one_reward_per_prompt_std():
    """Row [1, 2, 3, 4]: mean 2.5, population std sqrt(1.25) = 1.1180340 -> A = [-1.5, -0.5,
    0.5, 1.5] / 1.1180340 = [-1.3416408, -0.4472136, 0.4472136, 1.3416408] (eps = 0).
    Row [5, 5, 5, 5]: constant, A = 0 (with the default eps 1e-4 on the std: 0 / 1e-4; the
    first row's 1.5 then is 1.5 / 1.1181340 = 1.3415208)."""
    got = grpo_advantages({"r": torch.tensor([[1.0, 2.0, 3.0, 4.0]])}, {"r": 1.0}, "weighted_sum", eps=0.0)
    expected = torch.tensor([[-1.3416408, -0.4472136, 0.4472136, 1.3416408]], dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-6)
    rewards = {"r": torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])}
    default = grpo_advantages(rewards, {"r": 1.0}, "weighted_sum")
    assert default[0, 3].item() == pytest.approx(1.3415208, abs=1e-6)
    assert torch.equal(default[1], torch.zeros(4, dtype=torch.float64))


def test_group_advantages_two_rewards_combine_as_the_project_does():
    """w = {a: 1, b: 0.5}, per-prompt std, eps 0 (eps 1e-4 for the row with a constant group, where
    eps 0 would divide 0 by 0). R_a = [[0, 2], [0, 2]], R_b = [[6, 0], [3, 3]].
    normalised_sum: adv(R_a) = [[-1, 1], [-1, 1]] / 1.0001 (group stds 1); adv(R_b) =
        [[3, -3] / 3.0001, [0, 0]] (stds 3 and 0) -> adv(R_a) + 0.5 adv(R_b)
        = [[-0.9999000 + 0.4999833, ...]] = [[-0.4999167, 0.4999167], [-0.9999, 0.9999]], about
        [[-0.5, 0.5], [-1, 1]].
    weighted_sum: R_a + 0.5 R_b = [[3, 2], [1.5, 3.5]]: deviations [[0.5, -0.5], [-1, 1]],
        group stds 0.5 and 1 -> [[1, -1], [-1, 1]] (b's scale overrides a in the first prompt).
    std_scope "batch" (Flow-GRPO's SD3 configs): weighted_sum's one std over [3, 2, 1.5, 3.5]
        (mean 2.5, var (0.25 + 0.25 + 1 + 1) / 4 = 0.625) -> [[0.5, -0.5], [-1, 1]] / 0.7905694."""
    rewards = {"a": torch.tensor([[0.0, 2.0], [0.0, 2.0]]), "b": torch.tensor([[6.0, 0.0], [3.0, 3.0]])}
    weights = {"a": 1.0, "b": 0.5}
    normalised = grpo_advantages(rewards, weights, "normalised_sum")
    expected = torch.tensor([[-0.4999167, 0.4999167], [-0.9999, 0.9999]], dtype=torch.float64)
    assert torch.allclose(normalised, expected, atol=1e-6)
    weighted = grpo_advantages(rewards, weights, "weighted_sum", eps=0.0)
    assert torch.allclose(weighted, torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64))
    batch = grpo_advantages(rewards, weights, "weighted_sum", std_scope="batch", eps=0.0)
    expected = torch.tensor([[0.5, -0.5], [-1.0, 1.0]], dtype=torch.float64) / math.sqrt(0.625)
    assert torch.allclose(batch, expected)


def test_advantages_are_clamped_at_five():
    """One 1 among 37 zeros... (G = 37): mean 1/37, deviation of the 1 is 36/37, population std
    sqrt(36)/37 = 6/37, so its A = 6 -> clamped to 5; the zeros get -(1/37)/(6/37) = -1/6.
    clip_max = None leaves the 6."""
    row = torch.zeros(1, 37)
    row[0, 0] = 1.0
    got = grpo_advantages({"r": row}, {"r": 1.0}, "weighted_sum", eps=0.0)
    assert got[0, 0].item() == pytest.approx(5.0) and got[0, 1].item() == pytest.approx(-1 / 6)
    free = grpo_advantages({"r": row}, {"r": 1.0}, "weighted_sum", eps=0.0, clip_max=None)
    assert free[0, 0].item() == pytest.approx(6.0)


# ------------------------------------------------------------------------------ step choices
def test_train_steps_are_the_first_fraction_and_never_the_last():
    """N = 10: f = 0.99 (the default) -> floor(9.9) = 9 steps [0..8]; f = 0.5 -> [0..4]; N = 100, f = 0.29 ->
    29 (0.29 * 100 is 28.999999999999996 in floating point); f = 1 would train the last (ODE)
    step and f = 0.05 none: both refused."""
    assert train_steps(10, 0.99) == list(range(9)) == train_steps(10)
    assert train_steps(10, 0.5) == list(range(5))
    assert train_steps(100, 0.29) == list(range(29))
    assert default_sde_steps(10) == list(range(9))
    for bad in (1.0, 0.05, 0.0):
        with pytest.raises(ValueError, match="timestep_fraction"):
            train_steps(10, bad)


def test_fast_window_and_its_start_draw():
    """N = 10, k = 2: the window may lie in steps [0, 9) (not the last), so a start is drawn from
    [0, 7]; with window_range (0, 5) (the early half) from [0, 3]. 400 draws cover each exactly."""
    assert sde_window(10, 2, 3) == [3, 4]
    assert sde_window(10, 2, 7) == [7, 8]
    with pytest.raises(ValueError, match="SDE window"):
        sde_window(10, 2, 8)
    gen = torch.Generator().manual_seed(0)
    assert {draw_window_start(10, 2, gen) for _ in range(400)} == set(range(8))
    assert {draw_window_start(10, 2, gen, window_range=(0, 5)) for _ in range(400)} == set(range(4))
    with pytest.raises(ValueError, match="window_range"):
        draw_window_start(10, 3, gen, window_range=(0, 2))


# ----------------------------------------------------------------------------------- sampler
def _linear_velocity(x, s):
    """v = -x + 1, a made-up field: the samplers' bookkeeping does not need a meaningful one."""
    return 1.0 - x + 0 * s.reshape(-1, *([1] * (x.dim() - 1)))


def test_ode_sampler_is_the_euler_loop_and_draws_no_noise():
    """sde_steps = []: x_{k+1} = x_k + (s_{k+1} - s_k) v(x_k), with sigmas [1, 0.6, 0.2, 0];
    no records, and the generator is left untouched."""
    sigmas = torch.tensor([1.0, 0.6, 0.2, 0.0])
    noise = torch.randn(2, 3, 1, 2, 2, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    x0, records = sample_sde(_linear_velocity, noise, sigmas, 0.7, gen, sde_steps=[])
    x = noise
    for k in range(3):
        x = x + (sigmas[k + 1] - sigmas[k]) * _linear_velocity(x, sigmas[k].expand(2))
    assert torch.equal(x0, x) and records == []
    assert torch.equal(gen.get_state(), state)


def test_sde_sampler_records_chain_and_the_last_step_is_the_ode():
    """N = 4, default SDE steps [0, 1, 2]: one record each, each step starting where the last
    ended, its log_prob the old policy's step_log_prob, its noise x_next - mean = std * xi; the
    final step (0.2 -> 0) is Euler. The same seed gives the same rollout; another seed differs."""
    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.2, 0.0])
    noise = torch.randn(2, 3, 1, 2, 2, generator=torch.Generator().manual_seed(3))
    x0, recs = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(9))
    assert [r.index for r in recs] == [0, 1, 2]
    assert torch.equal(recs[0].x, noise)
    for prev, nxt in zip(recs, recs[1:]):
        assert torch.equal(prev.x_next, nxt.x)
    for r in recs:
        mean, std = sde_step_mean_std(r.x, _linear_velocity(r.x, r.sigma.expand(2)), r.sigma, r.sigma_next, 0.7)
        assert torch.equal(r.mean, mean) and torch.equal(r.std, std)
        assert torch.allclose(r.log_prob, step_log_prob(r.x_next, r.mean, r.std))
    last = recs[-1].x_next
    assert torch.allclose(x0, last + (0.0 - 0.2) * _linear_velocity(last, torch.full((2,), 0.2)))
    again, _ = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(9))
    other, _ = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(10))
    assert torch.equal(again, x0) and not torch.allclose(other, x0)
    with pytest.raises(ValueError, match="noise level a > 0"):
        sample_sde(_linear_velocity, noise, sigmas, 0.0, torch.Generator())


def test_fast_window_rollouts_share_the_ode_prefix():
    """SDE on the window [1, 2] of 5 steps: two seeds give the same latents up to step 1 (step 0
    is the ODE) and different ones after; records only for steps 1 and 2."""
    sigmas = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2, 0.0])
    noise = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    _, a = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(1), sde_window(5, 2, 1))
    _, b = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(2), sde_window(5, 2, 1))
    assert [r.index for r in a] == [1, 2]
    assert torch.equal(a[0].x, b[0].x) and not torch.allclose(a[0].x_next, b[0].x_next)


# ------------------------------------------------------------------- marginals: SDE vs ODE
MU, TAU = 0.8, 0.5


def _gaussian_target_velocity(x, s):
    """The exact flow velocity for data x0 ~ N(MU, TAU^2): x_s = (1 - s) x0 + s eps is Gaussian
    with mean (1 - s) MU and variance V = (1 - s)^2 TAU^2 + s^2, Cov(x_s, eps) = s,
    Cov(x_s, x0) = (1 - s) TAU^2, so v = E[eps | x] - E[x0 | x]
    = (s - (1 - s) TAU^2) (x - (1 - s) MU) / V - MU. (At s = 1: v = x - MU.)"""
    s = s.reshape(-1, *([1] * (x.dim() - 1)))
    var = (1 - s) ** 2 * TAU**2 + s**2
    return (s - (1 - s) * TAU**2) * (x - (1 - s) * MU) / var - MU


@pytest.mark.parametrize("first_sigma", [1.0, 0.999])
def test_sde_keeps_the_marginals_of_the_ode_on_a_gaussian_target(first_sigma):
    """20000 paths of 50 uniform steps from first_sigma to 0 (float64), the ODE and the SDE
    (a = 0.7, every step but the last) from the same noise. Both final samples must have mean MU
    and std TAU within 0.02: the Euler discretisation at 50 steps is about 0.01 (the ODE's std
    comes out near 0.49), 3 Monte-Carlo standard errors are 3 * 0.5/sqrt(20000) = 0.011 (mean) and
    3 * 0.5/sqrt(40000) = 0.008 (std). A sampler with the drift correction left out, or without
    the endpoint rule at 0.999 (sigma_s = 22 on the first step), misses by far more.
    Halfway (the record at sigma 0.5 +- a step) the SDE's latents follow the exact marginal
    N((1 - s) MU, (1 - s)^2 TAU^2 + s^2) within the same tolerance. The SDE is stochastic: its
    final sample correlates with the starting noise at about 0.2, the ODE's at 1."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(20000, 1, generator=gen, dtype=torch.float64)
    sigmas = torch.linspace(first_sigma, 0.0, 51, dtype=torch.float64)
    ode, _ = sample_sde(_gaussian_target_velocity, noise, sigmas, 0.7, gen, sde_steps=[])
    sde, records = sample_sde(_gaussian_target_velocity, noise, sigmas, 0.7, gen)
    for x in (ode, sde):
        assert abs(x.mean().item() - MU) < 0.02
        assert abs(x.std().item() - TAU) < 0.02
    mid = records[25]
    s = mid.sigma.item()
    assert abs(mid.x.mean().item() - (1 - s) * MU) < 0.02
    assert abs(mid.x.std().item() - math.sqrt((1 - s) ** 2 * TAU**2 + s**2)) < 0.02
    corr = lambda x: torch.corrcoef(torch.stack([noise[:, 0], x[:, 0]]))[0, 1].item()  # noqa: E731
    assert corr(ode) > 0.999 and corr(sde) < 0.5


def _point_mass_velocity(x, s):
    """The exact velocity for data x0 = MU (a point mass): x_s = (1 - s) MU + s eps, so
    eps = (x - (1 - s) MU) / s and v = eps - MU = (x - MU) / s."""
    return (x - MU) / s.reshape(-1, *([1] * (x.dim() - 1)))


def test_cps_keeps_the_noise_of_a_coarse_step_exact_where_the_sde_adds_noise():
    """The point of CPS, on a point-mass target (x0 = MU), 100000 float64 paths of 4 uniform steps
    1 -> 0.75 -> 0.5 -> 0.25 -> 0, every step but the last stochastic. With the exact velocity,
    x = (1 - s) MU + s eps and eps_hat = eps, x0_hat = MU, so:
    CPS (eta 0.8): x' = (1 - s') MU + s' (cos eps + sin xi), std exactly s' after every step;
    the Flow-SDE step (a = 0.7) gives x' = (1 - s') MU + (s' - c) eps + sigma sqrt(s - s') xi with
    c = (s - s') sigma^2 / (2 s). Its first step (endpoint rule: sigma^2 = 0.49 / 0.25 = 1.96,
    c = 0.245) leaves std sqrt(0.505^2 + 1.96 * 0.25) = 0.86315 where the marginal is 0.75.
    Monte-Carlo standard error of a std here: 0.75 / sqrt(200000) = 0.0017; tolerance 0.006."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(100000, 1, generator=gen, dtype=torch.float64)
    sigmas = torch.linspace(1.0, 0.0, 5, dtype=torch.float64)
    _, cps = sample_sde(_point_mass_velocity, noise, sigmas, 0.8, gen, dynamics="cps")
    assert [r.index for r in cps] == [0, 1, 2]
    for r in cps:
        s_next = r.sigma_next.item()
        assert abs(r.x_next.mean().item() - (1 - s_next) * MU) < 0.006
        assert abs(r.x_next.std().item() - s_next) < 0.006
        assert r.std.unique().tolist() == [pytest.approx(s_next * math.sin(0.4 * math.pi))]
    _, sde = sample_sde(_point_mass_velocity, noise, sigmas, 0.7, gen)
    assert abs(sde[0].x_next.std().item() - 0.86315) < 0.006


def test_cps_in_an_early_window_keeps_the_odes_samples_and_over_every_step_narrows_them():
    """The Gaussian target of the SDE check above (x0 ~ N(MU, TAU^2)), 10 uniform steps, 200000
    float64 paths from one noise. CPS's step is exact for a point mass (above) but not for a
    spread of data: it re-noises the posterior MEAN x0_hat, whose spread is below TAU's, so each
    CPS step narrows the sample a little. Measured here (seed 0): the Euler ODE ends at std 0.431
    (its own 10-step discretisation; TAU = 0.5), CPS (eta 0.8) on the early window [0, 1, 2] at
    0.427, on every step but the last at 0.352; the Flow-SDE (a = 0.7) on every step at 0.479.
    Asserted: the early-window CPS sample has the ODE's mean and std within 0.01 (Monte-Carlo
    standard error of a std: 0.43 / sqrt(400000) = 0.0007) and is stochastic; CPS over every step
    is narrower than the ODE by more than 0.05 (why preflight warns of it, docs/grpo_math.md)."""
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(200000, 1, generator=gen, dtype=torch.float64)
    sigmas = torch.linspace(1.0, 0.0, 11, dtype=torch.float64)
    ode, _ = sample_sde(_gaussian_target_velocity, noise, sigmas, 0.8, gen, sde_steps=[])
    window, _ = sample_sde(_gaussian_target_velocity, noise, sigmas, 0.8, gen, sde_steps=[0, 1, 2], dynamics="cps")
    assert abs(window.mean().item() - ode.mean().item()) < 0.01
    assert abs(window.std().item() - ode.std().item()) < 0.01
    assert torch.corrcoef(torch.stack([noise[:, 0], window[:, 0]]))[0, 1].item() < 0.9
    every, _ = sample_sde(_gaussian_target_velocity, noise, sigmas, 0.8, gen, dynamics="cps")
    assert abs(every.mean().item() - MU) < 0.01
    assert every.std().item() < ode.std().item() - 0.05


# ------------------------------------------------------------------- conditioned clips
def _clip(*frames: float) -> torch.Tensor:
    """One sample, one channel, the given latent frames, a 1x1 grid: [1, 1, T, 1, 1] float64."""
    return torch.tensor(frames, dtype=torch.float64).reshape(1, 1, -1, 1, 1)


def test_a_given_frame_adds_nothing_to_the_log_prob_the_kl_or_the_loss():
    """Three latent frames, the first given (clean_frames = 1). By hand: the generated frames'
    z = x_next - mean = [0.5, 0.5], std 0.5 -> mean z^2 / (2 std^2) = 0.25 / 0.5 = 0.5, logp =
    -0.5 + log 2 - 0.9189385 = -0.7257914, whatever frame 0 holds; KL with means [., 1, 3] and
    [., 0, 1], std 2 -> mean(1, 4) / 8 = 0.3125. Changing frame 0 of x_next, mean or mean_ref
    changes neither; changing a generated frame changes both; no gradient reaches frame 0."""
    std = torch.tensor([0.5], dtype=torch.float64)
    logp = step_log_prob(_clip(9.0, 1.0, 1.0), _clip(-5.0, 0.5, 0.5), std, clean_frames=1)
    assert logp.item() == pytest.approx(-0.5 + math.log(2) - HALF_LOG_2PI, abs=1e-12)
    assert torch.equal(logp, step_log_prob(_clip(-3.0, 1.0, 1.0), _clip(100.0, 0.5, 0.5), std, clean_frames=1))
    assert not torch.equal(logp, step_log_prob(_clip(9.0, 1.0, 2.0), _clip(-5.0, 0.5, 0.5), std, clean_frames=1))
    # unmasked, the given frame's (9 - -5)^2 would dominate: the mask is what keeps it out
    assert step_log_prob(_clip(9.0, 1.0, 1.0), _clip(-5.0, 0.5, 0.5), std).item() < -100

    two = torch.tensor([2.0], dtype=torch.float64)
    kl = gaussian_kl(_clip(7.0, 1.0, 3.0), _clip(-7.0, 0.0, 1.0), two, clean_frames=1)
    assert kl.item() == pytest.approx(0.3125, abs=1e-12)
    assert torch.equal(kl, gaussian_kl(_clip(0.0, 1.0, 3.0), _clip(50.0, 0.0, 1.0), two, clean_frames=1))
    assert not torch.equal(kl, gaussian_kl(_clip(7.0, 1.0, 4.0), _clip(-7.0, 0.0, 1.0), two, clean_frames=1))
    reference = step_kl(_clip(7.0, 1.0, 3.0), _clip(-7.0, 0.0, 1.0), two, 0.5, 0.25, "reference", clean_frames=1)
    assert reference.item() == pytest.approx(0.3125 * 0.25, abs=1e-12)

    # through the whole objective: the policy's mean gets no gradient on the given frame
    mean = _clip(-5.0, 0.5, 0.5).requires_grad_(True)
    logp_new = step_log_prob(_clip(9.0, 1.0, 1.0), mean, std, clean_frames=1)
    kl = gaussian_kl(mean, _clip(3.0, 0.0, 1.0), std, clean_frames=1)
    loss, _ = grpo_step_loss(logp_new, logp_new.detach() - 0.1, torch.tensor([1.0], dtype=torch.float64), kl, clip_range=0.2, kl_beta=0.04)
    loss.backward()
    assert mean.grad[0, 0, 0].item() == 0.0 and bool((mean.grad[0, 0, 1:] != 0).all())
    with pytest.raises(ValueError, match="must leave a generated latent frame"):
        step_log_prob(_clip(1.0, 1.0), _clip(0.0, 0.0), std, clean_frames=2)


def test_the_sampler_holds_a_condition_and_its_log_probs_read_the_generated_frames_only():
    """Latents [2, 3, 4, 2, 2], the first 2 latent frames given. The field is per element, so the
    generated frames do not see the given ones: every record's and the sample's given frames are
    the condition exactly, the generated frames and log-probs are those of any other condition
    values, and equal the unconditioned sampler's on those frames (its noise draws are the same:
    one xi shaped like the whole sample per SDE step)."""
    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.2, 0.0])
    noise = torch.randn(2, 3, 4, 2, 2, generator=torch.Generator().manual_seed(3))
    kept = noise.clone()
    given = torch.randn(2, 3, 2, 2, 2, generator=torch.Generator().manual_seed(4))
    x0, recs = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(9), condition=given)
    assert torch.equal(noise, kept)  # the caller's noise is not written into
    assert torch.equal(x0[:, :, :2], given.float()) and [r.clean_frames for r in recs] == [2, 2, 2]
    for r in recs:
        assert torch.equal(r.x[:, :, :2], given) and torch.equal(r.x_next[:, :, :2], given)
        assert torch.equal(r.log_prob, step_log_prob(r.x_next[:, :, 2:], r.mean[:, :, 2:], r.std))
        assert r.rows(slice(1, 2)).clean_frames == 2 and torch.equal(r.rows(slice(1, 2)).x, r.x[1:2])
    other_x0, other = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(9), condition=given * 10 - 3)
    assert torch.equal(other_x0[:, :, 2:], x0[:, :, 2:])
    assert all(torch.equal(a.log_prob, b.log_prob) for a, b in zip(recs, other))
    plain_x0, plain = sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator().manual_seed(9))
    assert torch.equal(plain_x0[:, :, 2:], x0[:, :, 2:])
    assert all(torch.equal(a.x_next[:, :, 2:], b.x_next[:, :, 2:]) for a, b in zip(recs, plain))
    with pytest.raises(ValueError, match="condition must be"):
        sample_sde(_linear_velocity, noise, sigmas, 0.7, torch.Generator(), condition=torch.zeros(2, 3, 4, 2, 2))


def test_image_rollouts_and_log_probs_are_the_unconditioned_loop_bit_for_bit():
    """Images (one latent frame, no condition) are what they were before clips: the sampler is the
    plain loop (Euler on ODE steps, sde_step on SDE steps, one xi per SDE step) and each log-prob
    the per-element mean written out here from the formula, compared bit for bit."""
    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.2, 0.0])
    noise = torch.randn(3, 4, 1, 2, 2, generator=torch.Generator().manual_seed(7))
    for dynamics, level, steps in (("sde", 0.7, None), ("cps", 0.8, [1, 2])):
        x0, recs = sample_sde(_linear_velocity, noise, sigmas, level, torch.Generator().manual_seed(11), steps, dynamics)
        gen, x, expected = torch.Generator().manual_seed(11), noise.float(), []
        for k in range(4):
            s, s_next = sigmas[k], sigmas[k + 1]
            v = _linear_velocity(x, s.expand(3))
            if k not in (steps if steps is not None else [0, 1, 2]):
                x = x + (s_next - s) * v
                continue
            xi = torch.randn(x.shape, generator=gen)
            x_next, mean, std = sde_step(x, v, s, s_next, level, xi, dynamics)
            squared = (x_next - mean).pow(2).flatten(1).mean(dim=1) / (2 * std.pow(2))
            expected.append(-squared - torch.log(std) - HALF_LOG_2PI)
            x = x_next
        assert torch.equal(x0, x) and len(recs) == len(expected)
        assert all(torch.equal(r.log_prob, e) and r.clean_frames == 0 for r, e in zip(recs, expected))
