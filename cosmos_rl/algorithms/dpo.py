"""Diffusion-DPO objective for flow models: pure functions of tensors.

Per preference pair (winner w, loser l, sharing noise and t), with per-sample MSEs of the
velocity prediction for the policy (theta) and the frozen reference (ref):

    inside = -0.5 * beta * [(mse_theta(w) - mse_ref(w)) - (mse_theta(l) - mse_ref(l))]
    loss   = -mean(logsigmoid(inside))

When theta == ref, inside == 0 and loss == log 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def per_sample_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every non-batch dim: [B, ...] x [B, ...] -> [B]."""
    if pred.shape != target.shape:
        raise ValueError(
            f"pred and target must have the same shape, got {tuple(pred.shape)} and "
            f"{tuple(target.shape)}"
        )
    if pred.dim() < 2:
        raise ValueError(f"expected [batch, ...] tensors with >= 2 dims, got {tuple(pred.shape)}")
    return (pred - target).pow(2).flatten(1).mean(dim=1)


def dpo_loss(
    mse_policy_w: torch.Tensor,
    mse_policy_l: torch.Tensor,
    mse_ref_w: torch.Tensor,
    mse_ref_l: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Diffusion-DPO loss from per-pair MSEs (each shape [P]); returns (scalar loss, metrics).

    The reference MSEs are detached here, so a caller that forgot `torch.no_grad()` around the
    reference pass still cannot push gradient into the reference.

    Metrics are detached 0-dim tensors (not python floats) so a trainer can stack and
    all-reduce them in one collective and sync with the device once, not once per metric:
      loss               the scalar loss
      dpo_accuracy       mean(1[inside > 0] + 0.5 * 1[inside == 0]); 0.5 at step 0
      dpo_reward_margin  mean(reward_w - reward_l) = mean(inside), reward = -0.5*beta*(mse_theta - mse_ref)
      policy_mse_winner / policy_mse_loser / ref_mse_winner / ref_mse_loser   batch means
    """
    shapes = {t.shape for t in (mse_policy_w, mse_policy_l, mse_ref_w, mse_ref_l)}
    if len(shapes) != 1 or mse_policy_w.dim() != 1:
        raise ValueError(
            "dpo_loss expects four per-pair tensors of identical shape [P], got "
            f"{[tuple(t.shape) for t in (mse_policy_w, mse_policy_l, mse_ref_w, mse_ref_l)]}"
        )
    mse_ref_w = mse_ref_w.detach()
    mse_ref_l = mse_ref_l.detach()

    reward_w = -0.5 * beta * (mse_policy_w - mse_ref_w)
    reward_l = -0.5 * beta * (mse_policy_l - mse_ref_l)
    inside = reward_w - reward_l
    loss = -F.logsigmoid(inside).mean()

    with torch.no_grad():
        inside_d = inside.detach()
        accuracy = (inside_d > 0).float() + 0.5 * (inside_d == 0).float()
        metrics = {
            "loss": loss.detach(),
            "dpo_accuracy": accuracy.mean(),
            "dpo_reward_margin": inside_d.mean(),
            "policy_mse_winner": mse_policy_w.detach().mean(),
            "policy_mse_loser": mse_policy_l.detach().mean(),
            "ref_mse_winner": mse_ref_w.mean(),
            "ref_mse_loser": mse_ref_l.mean(),
        }
    return loss, metrics
