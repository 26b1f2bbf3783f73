"""DiffusionNFT advantages, optimality, loss and old-policy schedule, checked by hand."""

import math

import pytest
import torch

from cosmos_rl.algorithms.nft import (
    clamp_advantages,
    group_advantages,
    nft_loss,
    old_decay,
    optimality,
    timestep_picks,
)


def test_advantages_of_one_group_1_2_3_4():
    """mean 2.5, deviations [-1.5, -0.5, 0.5, 1.5], population var (2.25+0.25+0.25+2.25)/4
    = 1.25, std = sqrt(1.25) = 1.1180340; with eps = 0: A = dev / 1.1180340
    = [-1.3416408, -0.4472136, 0.4472136, 1.3416408]. One group, so both scopes agree."""
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    expected = torch.tensor([[-1.3416408, -0.4472136, 0.4472136, 1.3416408]])
    for scope in ("group", "batch"):
        got = group_advantages(rewards, eps=0.0, std_scope=scope)
        assert torch.allclose(got, expected, atol=1e-6)


def test_default_eps_is_added_to_the_std():
    """[[1, 3]]: deviations [-1, 1], std 1, A = [-1, 1] / (1 + 1e-4)."""
    got = group_advantages(torch.tensor([[1.0, 3.0]]))
    assert torch.allclose(got, torch.tensor([[-1.0, 1.0]]) / 1.0001, atol=1e-7)


def test_group_versus_batch_std():
    """rewards [[-7, 7], [-1, 1]]: group means 0, deviations equal the rewards.
    group std: 7 and 1 -> A = [[-1, 1], [-1, 1]].
    batch std: mean 0, var (49+49+1+1)/4 = 25, std 5 -> A = [[-1.4, 1.4], [-0.2, 0.2]].
    Default scope is batch."""
    rewards = torch.tensor([[-7.0, 7.0], [-1.0, 1.0]])
    group = group_advantages(rewards, eps=0.0, std_scope="group")
    batch = group_advantages(rewards, eps=0.0, std_scope="batch")
    default = group_advantages(rewards, eps=0.0)
    assert torch.allclose(group, torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]))
    assert torch.allclose(batch, torch.tensor([[-1.4, 1.4], [-0.2, 0.2]]))
    assert torch.equal(default, batch)


def test_group_mean_is_per_prompt():
    """[[0, 2], [10, 12]]: group means 1 and 11, deviations [-1, 1] in both rows.
    group std 1 in both rows -> A = [-1, 1] in both rows.
    batch std is taken over the raw rewards [0, 2, 10, 12]: mean 6, var (36+16+16+36)/4 = 26,
    while the deviations stay per group -> A = [-1, 1] / sqrt(26) in both rows."""
    rewards = torch.tensor([[0.0, 2.0], [10.0, 12.0]])
    group = group_advantages(rewards, eps=0.0, std_scope="group")
    assert torch.allclose(group, torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]))
    batch = group_advantages(rewards, eps=0.0, std_scope="batch")
    s = math.sqrt(26.0)
    assert torch.allclose(batch, torch.tensor([[-1 / s, 1 / s], [-1 / s, 1 / s]]))


def test_constant_group_gets_zero_advantage():
    got = group_advantages(torch.tensor([[3.0, 3.0, 3.0]]), std_scope="group")
    assert torch.equal(got, torch.zeros(1, 3))


def test_bad_std_scope_and_shape_are_rejected():
    with pytest.raises(ValueError, match="std_scope"):
        group_advantages(torch.zeros(2, 2), std_scope="global")
    with pytest.raises(ValueError, match="num_prompts"):
        group_advantages(torch.zeros(4))


def test_clamp_advantages():
    """[-9, -1, 0, 2, 9] clipped to [-5, 5] -> [-5, -1, 0, 2, 5]."""
    got = clamp_advantages(torch.tensor([-9.0, -1.0, 0.0, 2.0, 9.0]), -5.0, 5.0)
    assert torch.equal(got, torch.tensor([-5.0, -1.0, 0.0, 2.0, 5.0]))
    with pytest.raises(ValueError, match="low must be below high"):
        clamp_advantages(torch.zeros(1), 1.0, 1.0)


def test_linear_optimality_endpoints_and_official_form():
    """low = -5, high = 5: r = (A + 5) / 10.
    A = -5 -> 0; A = 5 -> 1; A = 0 -> 0.5; A = 2 -> 0.7; A = -9 clamps to -5 -> 0."""
    a = torch.tensor([-5.0, 5.0, 0.0, 2.0, -9.0])
    r = optimality(a, "linear", -5.0, 5.0, tau=0.5)
    assert torch.allclose(r, torch.tensor([0.0, 1.0, 0.5, 0.7, 0.0]))


def test_span_optimality_asymmetric_range():
    """The map before rl.linear_map, (A - low) / (high - low); low = -1, high = 3:
    A = -1 -> 0, A = 3 -> 1, A = 0 -> 1/4 (not 0.5), A = 1 -> 1/2."""
    r = optimality(torch.tensor([-1.0, 3.0, 0.0, 1.0]), "linear", -1.0, 3.0, tau=1.0, linear="span")
    assert torch.allclose(r, torch.tensor([0.0, 1.0, 0.25, 0.5]))


def test_per_side_optimality_keeps_zero_at_one_half_for_an_asymmetric_clamp():
    """DiffusionNFT's map, each side on its own; low = -1, high = 5:
    below 0, r = (A + 1) / 2:  A = -3 clamps to -1 -> 0; A = -1 -> 0; A = -0.5 -> 0.25;
    from 0 up, r = (A + 5) / 10: A = 0 -> 0.5; A = 2.5 -> 0.75; A = 5 -> 1; A = 9 clamps to 5 -> 1.
    The default of `optimality` is this map."""
    a = torch.tensor([-3.0, -1.0, -0.5, 0.0, 2.5, 5.0, 9.0])
    expected = torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0])
    assert torch.allclose(optimality(a, "linear", -1.0, 5.0, tau=1.0, linear="per_side"), expected)
    assert torch.equal(optimality(a, "linear", -1.0, 5.0, tau=1.0), optimality(a, "linear", -1.0, 5.0, 1.0, linear="per_side"))
    # the span map of the same clamp: A = 0 -> (0 + 1) / 6 = 1/6, A = 2.5 -> 3.5 / 6
    span = optimality(torch.tensor([0.0, 2.5]), "linear", -1.0, 5.0, tau=1.0, linear="span")
    assert torch.allclose(span, torch.tensor([1 / 6, 3.5 / 6]))


def test_per_side_and_span_agree_bit_for_bit_for_a_symmetric_clamp():
    """(A + s) / (2 s) with s = c = high = -low is (A - low) / (high - low) term by term, so the
    shipped manifests' -5 / 5 (and any symmetric clamp) compute exactly what they did."""
    a = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 4
    for c in (5.0, 2.3, 1.0):
        per_side = optimality(a, "linear", -c, c, 1.0, linear="per_side")
        span = optimality(a, "linear", -c, c, 1.0, linear="span")
        assert torch.equal(per_side, span)


def test_per_side_needs_a_clamp_holding_zero_and_a_known_name():
    with pytest.raises(ValueError, match="low < 0 < high"):
        optimality(torch.zeros(1), "linear", 0.5, 3.0, 1.0, linear="per_side")
    with pytest.raises(ValueError, match="linear_map"):
        optimality(torch.zeros(1), "linear", -1.0, 1.0, 1.0, linear="centred")
    # span takes any non-empty clamp: low = 1, high = 3, A = 2 -> 1/2
    assert optimality(torch.tensor([2.0]), "linear", 1.0, 3.0, 1.0, linear="span").item() == 0.5


def _equal_rewards_gradient(linear: str) -> torch.Tensor:
    """d policy_loss / d v_theta for one sample of a group of equal rewards, clamp (-1, 5)."""
    advantages = clamp_advantages(group_advantages(torch.tensor([[0.3, 0.3, 0.3, 0.3]], dtype=torch.float64)), -1.0, 5.0)
    r = optimality(advantages, "linear", -1.0, 5.0, 1.0, linear=linear)[0, :1]
    v_theta = torch.ones(1, 1, dtype=torch.float64, requires_grad=True)
    loss, _ = nft_loss(v_theta, torch.ones(1, 1, dtype=torch.float64), None, torch.zeros(1, 1, dtype=torch.float64),
                       r.to(torch.float64), beta=1.0, policy_loss_scale=1.0, kl_beta=0.0)
    loss.backward()
    return v_theta.grad


def test_a_group_of_equal_rewards_moves_nothing_under_the_default_map():
    """Equal rewards -> A = 0. With v_theta = v_old = 1, target v = 0, beta = 1, scale 1, one element:
    loss = r (v_theta - 0)^2 + (1 - r) (2 v_old - v_theta)^2, so d/dv_theta = 2 r v_theta - 2 (1 - r)(2 - v_theta)
    = 2 (2 r - 1) at v_theta = 1. per_side: r = 0.5 -> 0. span: r = 1/6 -> 2 (1/3 - 1) = -4/3."""
    assert _equal_rewards_gradient("per_side").item() == 0.0
    assert _equal_rewards_gradient("span").item() == pytest.approx(-4 / 3, rel=1e-12)


def test_sigmoid_optimality():
    """sigmoid(0) = 0.5; tau = 0.5, A = ln(3)/2 -> sigmoid(ln 3) = 3/(3+1) = 0.75;
    A = -ln(3)/2 -> 0.25."""
    a = torch.tensor([0.0, math.log(3) / 2, -math.log(3) / 2])
    r = optimality(a, "sigmoid", -5.0, 5.0, tau=0.5)
    assert torch.allclose(r, torch.tensor([0.5, 0.75, 0.25]))


def test_unknown_r_map_is_a_user_error_naming_the_key():
    with pytest.raises(ValueError, match="r_map"):
        optimality(torch.zeros(1), "tanh", -5.0, 5.0, 0.5)


def test_nft_loss_by_hand_beta_one():
    """beta = 1: v_pos = v_theta, v_neg = 2*v_old - v_theta = -v_theta (v_old = 0).
    v_theta  = [[1, 1], [0, 2]], v_target = [[1, 0], [1, 1]], v_ref = [[0, 1], [0, 0]],
    r = [1, 0.5], policy_loss_scale = 2, kl_beta = 0.4.
    sample 0: pos err [0, 1] -> 0.5;  neg = [-1,-1], err [-2,-1] -> 2.5
    sample 1: pos err [-1, 1] -> 1;   neg = [0,-2],  err [-1,-3] -> 5
    positive_error = 0.75, negative_error = 3.75
    per sample r*pos + (1-r)*neg: 0.5 and 0.5*1 + 0.5*5 = 3 -> mean 1.75
    policy_loss = 2 * 1.75 / 1 = 3.5
    kl: v_theta - v_ref = [[1, 0], [0, 2]] -> (1+0+0+4)/4 = 1.25; total = 3.5 + 0.4*1.25 = 4.0
    optimality_mean = 0.75, second moment (1 + 0.25)/2 = 0.625."""
    v_theta = torch.tensor([[1.0, 1.0], [0.0, 2.0]], requires_grad=True)
    v_old = torch.zeros(2, 2, requires_grad=True)
    v_ref = torch.tensor([[0.0, 1.0], [0.0, 0.0]], requires_grad=True)
    v_target = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    r = torch.tensor([1.0, 0.5])
    loss, m = nft_loss(v_theta, v_old, v_ref, v_target, r, beta=1.0,
                       policy_loss_scale=2.0, kl_beta=0.4)
    assert loss.item() == pytest.approx(4.0)
    assert m["loss"].item() == pytest.approx(4.0)
    assert m["policy_loss"].item() == pytest.approx(3.5)
    assert m["kl_loss"].item() == pytest.approx(1.25)
    assert m["positive_error"].item() == pytest.approx(0.75)
    assert m["negative_error"].item() == pytest.approx(3.75)
    assert m["optimality_mean"].item() == pytest.approx(0.75)
    assert m["optimality_second_moment"].item() == pytest.approx(0.625)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    loss.backward()
    assert v_theta.grad is not None
    assert v_old.grad is None and v_ref.grad is None  # constants of the objective


def test_nft_loss_mixes_old_and_theta_and_its_gradient():
    """One sample, one element, beta = 0.5, v_old = 2, v_theta = 0, target 0, r = 0.25,
    scale 1, kl_beta 0.
    v_pos = 0.5*2 + 0.5*0 = 1 -> err 1; v_neg = 1.5*2 - 0.5*0 = 3 -> err 9
    loss = (0.25*1 + 0.75*9) / 0.5 = 7 / 0.5 = 14
    d/dv_theta = [r*2*(v_pos)*beta + (1-r)*2*(v_neg)*(-beta)] / beta
              = 2*0.25*1 - 2*0.75*3 = 0.5 - 4.5 = -4."""
    v_theta = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = nft_loss(v_theta, torch.tensor([[2.0]]), torch.tensor([[0.0]]),
                       torch.tensor([[0.0]]), torch.tensor([0.25]), beta=0.5,
                       policy_loss_scale=1.0, kl_beta=0.0)
    assert loss.item() == pytest.approx(14.0)
    loss.backward()
    assert v_theta.grad.item() == pytest.approx(-4.0)


def test_nft_loss_x0_weighting_flag():
    """beta = 1, v_old = 0, v_target = 0, v_theta = [[1, 3]], t = 0.5, r = 1, scale 1.
    x0 error = t * (v_pos - v) = [0.5, 1.5]; mean square (0.25 + 2.25)/2 = 1.25;
    stop-grad scale mean|.| = 1 -> positive_error = 1.25 = loss.
    v_neg = -v_theta gives the same 1.25 for negative_error.
    Gradient with the scale held constant: d/dv_i mean((t v)^2) = 2 t^2 v_i / 2 = 0.25 v_i
    -> [0.25, 0.75] (letting gradient through the scale would subtract t*mean(v^2)/(2*mean|v|^2)
    = 0.5*5/8 = 0.3125 from each).
    Without the flag the velocity-space error is (1 + 9)/2 = 5."""
    v_theta = torch.tensor([[1.0, 3.0]], requires_grad=True)
    zeros = torch.zeros(1, 2)
    loss, m = nft_loss(v_theta, zeros, zeros, zeros, torch.tensor([1.0]), beta=1.0,
                       policy_loss_scale=1.0, kl_beta=0.0, x0_weighting_t=torch.tensor([0.5]))
    assert loss.item() == pytest.approx(1.25)
    assert m["negative_error"].item() == pytest.approx(1.25)
    loss.backward()
    assert torch.allclose(v_theta.grad, torch.tensor([[0.25, 0.75]]))

    plain, _ = nft_loss(v_theta, zeros, zeros, zeros, torch.tensor([1.0]), beta=1.0,
                        policy_loss_scale=1.0, kl_beta=0.0)
    assert plain.item() == pytest.approx(5.0)


def test_nft_loss_without_a_reference_reports_no_kl():
    """v_ref = None (kl_beta = 0): the loss is the policy loss alone and no kl_loss is reported;
    with v_ref given the same inputs report kl = mean((1 - 0)^2, (3 - 0)^2) = 5."""
    v_theta = torch.tensor([[1.0, 3.0]])
    zeros = torch.zeros(1, 2)
    loss, m = nft_loss(v_theta, zeros, None, zeros, torch.tensor([1.0]), beta=1.0,
                       policy_loss_scale=1.0, kl_beta=0.0, x0_weighting_t=None)
    assert "kl_loss" not in m and loss.item() == pytest.approx(5.0)
    _, m = nft_loss(v_theta, zeros, zeros, zeros, torch.tensor([1.0]), beta=1.0,
                    policy_loss_scale=1.0, kl_beta=0.0)
    assert m["kl_loss"].item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="v_ref is needed"):
        nft_loss(v_theta, zeros, None, zeros, torch.tensor([1.0]), beta=1.0, policy_loss_scale=1.0, kl_beta=0.1)


def test_timestep_picks_draw_k_distinct_per_sample_and_leave_out_a_random_one():
    """10 sampler timesteps, 0 = all but one: each row has 9 distinct indices, and over 200 rows
    the left-out index is not always the last (the smallest sigma) but covers every position."""
    gen = torch.Generator().manual_seed(0)
    picks = timestep_picks(10, 200, 0, gen)
    assert picks.shape == (200, 9)
    assert all(len(set(row.tolist())) == 9 for row in picks)
    left_out = {(set(range(10)) - set(row.tolist())).pop() for row in picks}
    assert left_out == set(range(10))
    three = timestep_picks(10, 50, 3, gen)
    assert three.shape == (50, 3) and len({tuple(sorted(r.tolist())) for r in three}) > 1
    assert timestep_picks(10, 4, 10, gen).sort(dim=1).values.tolist() == [list(range(10))] * 4
    assert timestep_picks(1, 2, 0, gen).tolist() == [[0], [0]]
    with pytest.raises(ValueError, match="per_sample"):
        timestep_picks(10, 1, 11, gen)


def test_nft_loss_rejects_bad_inputs():
    v = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="beta"):
        nft_loss(v, v, v, v, torch.zeros(2), beta=0.0, policy_loss_scale=1.0, kl_beta=0.0)
    with pytest.raises(ValueError, match="r must be shaped"):
        nft_loss(v, v, v, v, torch.zeros(3), beta=1.0, policy_loss_scale=1.0, kl_beta=0.0)
    with pytest.raises(ValueError, match="share one"):
        nft_loss(v, torch.zeros(2, 4), v, v, torch.zeros(2), beta=1.0,
                 policy_loss_scale=1.0, kl_beta=0.0)


def test_old_decay_schedule():
    """min(0.001 * step, 0.5): step 0 -> 0, 100 -> 0.1, 500 -> 0.5, 2000 -> 0.5 (capped)."""
    assert old_decay(0) == 0.0
    assert old_decay(100) == pytest.approx(0.1)
    assert old_decay(500) == pytest.approx(0.5)
    assert old_decay(2000) == 0.5
    assert old_decay(10, cap=0.9, rate=0.05) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        old_decay(-1)


def test_old_decay_flat_start():
    """DiffusionNFT's OCR schedule (flat 75, rate 0.0075, cap 0.999): 0 through step 74, then
    0.0075 * (step - 75): step 75 -> 0, 76 -> 0.0075, 175 -> 0.75, 300 -> min(1.6875, 0.999)."""
    schedule = dict(cap=0.999, rate=0.0075, flat=75)
    assert old_decay(0, **schedule) == 0.0
    assert old_decay(74, **schedule) == 0.0
    assert old_decay(75, **schedule) == 0.0
    assert old_decay(76, **schedule) == pytest.approx(0.0075)
    assert old_decay(175, **schedule) == pytest.approx(0.75)
    assert old_decay(300, **schedule) == 0.999
    assert old_decay(100, flat=0) == old_decay(100)  # flat 0 is the plain schedule
    with pytest.raises(ValueError, match="flat"):
        old_decay(5, flat=-1)
