"""Diffusion-DPO loss, checked against values worked out by hand."""

import math

import pytest
import torch

from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse


def test_per_sample_mse_averages_every_non_batch_dim():
    """Sample 0: errors [1, 2, 3, 4] -> (1 + 4 + 9 + 16) / 4 = 7.5.
    Sample 1: errors all 2 -> 4.
    """
    pred = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[3.0, 3.0], [3.0, 3.0]]]])  # [2,1,2,2]
    target = torch.tensor([[[[0.0, 0.0], [0.0, 0.0]]], [[[1.0, 1.0], [1.0, 1.0]]]])
    assert torch.equal(per_sample_mse(pred, target), torch.tensor([7.5, 4.0]))


def test_per_sample_mse_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        per_sample_mse(torch.zeros(2, 3), torch.zeros(2, 4))


def test_loss_is_log2_and_accuracy_half_when_policy_equals_reference():
    """theta == ref: inside = 0 for every pair, loss = -logsigmoid(0) = log 2,
    every pair is a tie so accuracy = 0.5, margin = 0."""
    mse_w = torch.tensor([0.3, 1.7, 0.9])
    mse_l = torch.tensor([0.5, 0.2, 1.1])
    loss, m = dpo_loss(mse_w, mse_l, mse_w.clone(), mse_l.clone(), beta=1000.0)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    assert m["dpo_accuracy"].item() == 0.5
    assert m["dpo_reward_margin"].item() == 0.0


def test_two_pair_example_by_hand():
    """beta = 2.
    Pair 1: policy_w = 1, ref_w = 2, policy_l = 2, ref_l = 2
        reward_w = -0.5*2*(1-2) = 1, reward_l = 0, inside = 1
    Pair 2: policy_w = 4, ref_w = 1, policy_l = 1, ref_l = 1
        reward_w = -0.5*2*(4-1) = -3, reward_l = 0, inside = -3
    loss = 0.5 * [log(1 + e^-1) + log(1 + e^3)]
         = 0.5 * [0.3132617 + 3.0485874] = 1.6809245
    accuracy = (1 + 0) / 2 = 0.5; margin = (1 - 3) / 2 = -1
    policy_mse_winner = (1+4)/2 = 2.5, policy_mse_loser = (2+1)/2 = 1.5,
    ref_mse_winner = (2+1)/2 = 1.5, ref_mse_loser = (2+1)/2 = 1.5
    """
    loss, m = dpo_loss(
        mse_policy_w=torch.tensor([1.0, 4.0]),
        mse_policy_l=torch.tensor([2.0, 1.0]),
        mse_ref_w=torch.tensor([2.0, 1.0]),
        mse_ref_l=torch.tensor([2.0, 1.0]),
        beta=2.0,
    )
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(1.6809245, abs=1e-6)
    assert m["loss"].item() == pytest.approx(1.6809245, abs=1e-6)
    assert m["dpo_accuracy"].item() == 0.5
    assert m["dpo_reward_margin"].item() == pytest.approx(-1.0)
    assert m["policy_mse_winner"].item() == 2.5
    assert m["policy_mse_loser"].item() == 1.5
    assert m["ref_mse_winner"].item() == 1.5
    assert m["ref_mse_loser"].item() == 1.5
    assert set(m) == {
        "loss", "dpo_accuracy", "dpo_reward_margin", "policy_mse_winner",
        "policy_mse_loser", "ref_mse_winner", "ref_mse_loser",
    }
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_accuracy_counts_ties_half():
    """beta = 2, ref = 0 everywhere, loser policy mse = 0, so inside = -policy_w:
    policy_w = [-1, 0, 1, -2] -> inside = [1, 0, -1, 2] -> accuracy (1 + 0.5 + 0 + 1)/4 = 0.625.
    (Negative MSEs are not physical; they just make inside round numbers.)"""
    zeros = torch.zeros(4)
    _, m = dpo_loss(torch.tensor([-1.0, 0.0, 1.0, -2.0]), zeros, zeros, zeros, beta=2.0)
    assert m["dpo_accuracy"].item() == 0.625


def test_gradient_signs_at_the_reference():
    """One pair, beta = 4, theta == ref so inside = 0.
    dloss/dinside = -sigmoid(-inside) = -0.5; dinside/dmse_theta_w = -0.5*beta = -2
    -> dloss/dmse_theta_w = +1 (lowering the winner's policy MSE lowers the loss),
       dloss/dmse_theta_l = -1 (raising the loser's policy MSE lowers the loss)."""
    w = torch.tensor([0.5], requires_grad=True)
    l = torch.tensor([0.5], requires_grad=True)
    ref_w = torch.tensor([0.5], requires_grad=True)
    loss, _ = dpo_loss(w, l, ref_w, torch.tensor([0.5]), beta=4.0)
    loss.backward()
    assert w.grad.item() == pytest.approx(1.0)
    assert l.grad.item() == pytest.approx(-1.0)
    assert ref_w.grad is None  # the reference is a constant

    # And the direct check: a lower winner MSE gives a lower loss.
    lower, _ = dpo_loss(torch.tensor([0.4]), torch.tensor([0.5]), torch.tensor([0.5]),
                        torch.tensor([0.5]), beta=4.0)
    assert lower.item() < loss.item()


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="identical shape"):
        dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2), beta=1.0)
