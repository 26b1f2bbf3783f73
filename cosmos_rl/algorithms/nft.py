"""DiffusionNFT objective: advantages, optimality map, loss, and the old-policy schedule.

Pure functions of tensors (no model, no process groups). A trainer gathers the rewards of
the whole step before calling `group_advantages`, so "batch" below means everything it passed.
"""

from __future__ import annotations

import torch

STD_SCOPES = ("group", "batch")
R_MAPS = ("linear", "sigmoid")
# How r_map = "linear" maps a clamped advantage (rl.linear_map): "per_side" is DiffusionNFT's
# 0.5 + clip(A, -c, c) / (2c), each side of 0 on its own; "span" the map runs used before it.
LINEAR_MAPS = ("per_side", "span")

# Floor for the stop-gradient x0-error normaliser: at t == 0 the x0 error is exactly zero.
_X0_WEIGHT_FLOOR = 1e-5


def group_advantages(
    rewards: torch.Tensor, eps: float = 1e-4, std_scope: str = "batch"
) -> torch.Tensor:
    """Advantages `(R - group mean) / (std + eps)` for rewards shaped [num_prompts, group_size].

    std_scope:
      "batch" (default) - one std over every reward passed in, as the official DiffusionNFT
          release does. Groups whose samples barely differ keep small advantages instead of
          having noise-level differences blown up to unit scale, and every group's advantages
          are on one common scale.
      "group" - std within each prompt's group (GRPO style): every non-constant group gets
          unit-scale advantages regardless of how much its rewards actually spread.
    Std is the population std (divide by N): the rewards are the whole population in question.
    A constant group gets advantage 0 in either scope.
    """
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be shaped [num_prompts, group_size], got {tuple(rewards.shape)}"
        )
    if std_scope not in STD_SCOPES:
        raise ValueError(f"std_scope must be one of {list(STD_SCOPES)}, got {std_scope!r}")
    rewards = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if std_scope == "group":
        std = rewards.std(dim=1, keepdim=True, unbiased=False)
    else:
        std = rewards.std(unbiased=False)
    return centred / (std + eps)


def clamp_advantages(a: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Clip advantages to [low, high] so a few outliers cannot dominate the loss."""
    if not low < high:
        raise ValueError(f"low must be below high, got low={low}, high={high}")
    return a.clamp(min=low, max=high)


def optimality(
    a: torch.Tensor, r_map: str, low: float, high: float, tau: float, linear: str = "per_side"
) -> torch.Tensor:
    """Optimality probability r in [0, 1] for each sample's advantage.

    linear, `linear = "per_side"` (the default; DiffusionNFT's map): A = 0 -> 0.5 for any clamp,
             each side of 0 mapped on its own, [low, 0] -> [0, 0.5] and [0, high] -> [0.5, 1]:
             r = (A + s) / (2 s) with s = -low below 0 and s = high from 0 up (needs low < 0 < high).
             With low = -5, high = 5 it is the official 0.5 + clip(A, -5, 5) / 10.
    linear, `linear = "span"` (what runs computed before rl.linear_map existed):
             r = (A - low) / (high - low), which sends A = 0 to 0.5 only for a symmetric clamp;
             with (-1, 5) a group of equal rewards gets r = 1/6 and still a gradient.
             For a symmetric clamp the two agree bit for bit: s = high = -low and 2 s = high - low.
    sigmoid: r = sigmoid(A / tau).
    The clamp keeps r a probability even if the caller skipped `clamp_advantages`.
    """
    if r_map == "linear":
        clamped = clamp_advantages(a, low, high)
        if linear == "span":
            return (clamped - low) / (high - low)
        if linear != "per_side":
            raise ValueError(f"linear_map must be one of {list(LINEAR_MAPS)}, got {linear!r}")
        if not low < 0 < high:
            raise ValueError(
                f"linear_map 'per_side' maps [low, 0] and [0, high] on their own, so it needs low < 0 < high, "
                f"got low={low}, high={high}"
            )
        s = torch.where(clamped < 0, torch.full_like(clamped, -low), torch.full_like(clamped, high))
        return (clamped + s) / (2 * s)
    if r_map == "sigmoid":
        if not tau > 0:
            raise ValueError(f"tau must be > 0 for r_map = 'sigmoid', got {tau}")
        return torch.sigmoid(a / tau)
    raise ValueError(f"r_map must be one of {list(R_MAPS)}, got {r_map!r}")


def _per_sample_mean(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1).mean(dim=1)


def _branch_error(
    v_branch: torch.Tensor, v_target: torch.Tensor, x0_weighting_t: torch.Tensor | None
) -> torch.Tensor:
    """Per-sample squared error of one implicit policy, in velocity or (normalised) x0 space."""
    diff = v_branch - v_target
    if x0_weighting_t is None:
        return _per_sample_mean(diff.pow(2))
    # x0_hat - x0 = (x_t - t*v_branch) - (x_t - t*v_target) = -t * diff, so x_t is not needed.
    t = x0_weighting_t.to(diff.dtype).reshape(-1, *([1] * (diff.dim() - 1)))
    x0_diff = t * diff
    with torch.no_grad():
        scale = _per_sample_mean(x0_diff.abs()).clamp(min=_X0_WEIGHT_FLOOR)
    return _per_sample_mean(x0_diff.pow(2)) / scale


def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    v_ref: torch.Tensor | None,
    v_target: torch.Tensor,
    r: torch.Tensor,
    beta: float,
    policy_loss_scale: float,
    kl_beta: float,
    x0_weighting_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DiffusionNFT loss on velocities shaped [B, ...] and optimality r shaped [B].

        v_pos = (1 - beta) * v_old + beta * v_theta
        v_neg = (1 + beta) * v_old - beta * v_theta
        policy_loss = policy_loss_scale * mean(r * err(v_pos) + (1 - r) * err(v_neg)) / beta
        kl_loss     = mean((v_theta - v_ref)^2)
        loss        = policy_loss + kl_beta * kl_loss
    err() is a per-sample mean (MEAN reduction throughout): in x0 space when x0_weighting_t is
    given, which is what runs do by default (rl.x0_weighting = true), else the squared velocity
    error of the spec's formula. r comes from `optimality` (default map: A = 0 -> r = 0.5).
    v_old and v_ref are detached here: they are constants of the objective. v_ref = None (only with
    kl_beta = 0) leaves the KL term out, and `kl_loss` out of the metrics: a KL that was not
    measured is never reported as 0.

    x0_weighting_t (shape [B]; None = velocity space): when given, err() is the official
    release's stability variant - the squared error of x0_hat = x_t - t * v in x0 space, divided
    by a stop-gradient of that sample's mean absolute x0 error. The trainer passes the samples'
    t whenever rl.x0_weighting is true, its default, as the official release does; run
    directories saved before that knob keep the velocity-space error (rl.x0_weighting = false).

    Metrics (detached 0-dim tensors, batch means): loss, policy_loss, kl_loss (when v_ref), positive_error,
    negative_error, optimality_mean, optimality_second_moment.
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0 (the policy loss divides by it), got {beta}")
    if v_ref is None and kl_beta != 0:
        raise ValueError(f"v_ref is needed for kl_beta = {kl_beta}")
    given = [v for v in (v_theta, v_old, v_ref, v_target) if v is not None]
    shapes = {tuple(v.shape) for v in given}
    if len(shapes) != 1 or v_theta.dim() < 2:
        raise ValueError(
            "v_theta, v_old, v_ref, v_target must share one [B, ...] shape, got "
            f"{[tuple(v.shape) for v in given]}"
        )
    if r.shape != (v_theta.shape[0],):
        raise ValueError(f"r must be shaped [B]=[{v_theta.shape[0]}], got {tuple(r.shape)}")
    if x0_weighting_t is not None and x0_weighting_t.shape != r.shape:
        raise ValueError(
            f"x0_weighting_t must be shaped [B]=[{v_theta.shape[0]}], "
            f"got {tuple(x0_weighting_t.shape)}"
        )
    v_old = v_old.detach()
    v_target = v_target.detach()
    r = r.detach().to(v_theta.dtype)

    v_pos = (1 - beta) * v_old + beta * v_theta
    v_neg = (1 + beta) * v_old - beta * v_theta
    positive_error = _branch_error(v_pos, v_target, x0_weighting_t)
    negative_error = _branch_error(v_neg, v_target, x0_weighting_t)
    policy_loss = (
        policy_loss_scale * (r * positive_error + (1 - r) * negative_error).mean() / beta
    )
    metrics = {"policy_loss": policy_loss.detach()}
    loss = policy_loss
    if v_ref is not None:
        kl_loss = (v_theta - v_ref.detach()).pow(2).mean()
        loss = policy_loss + kl_beta * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    metrics = {
        "loss": loss.detach(),
        **metrics,
        "positive_error": positive_error.detach().mean(),
        "negative_error": negative_error.detach().mean(),
        "optimality_mean": r.mean(),
        "optimality_second_moment": r.pow(2).mean(),
    }
    return loss, metrics


def timestep_picks(
    num_timesteps: int, rows: int, per_sample: int, generator: torch.Generator, device=None
) -> torch.Tensor:
    """Which of a rollout's `num_timesteps` sampler timesteps each of `rows` samples trains on.

    Returns indices shaped [rows, k]: for every row, k distinct timesteps drawn at random (a fresh
    permutation per row), as the official release draws them. `per_sample = 0` means all but one,
    the one left out drawn at random per row; never "always drop the smallest".
    """
    if num_timesteps < 1:
        raise ValueError(f"num_timesteps must be >= 1, got {num_timesteps}")
    k = per_sample or max(num_timesteps - 1, 1)
    if not 1 <= k <= num_timesteps:
        raise ValueError(f"per_sample must be in [0, {num_timesteps}], got {per_sample}")
    return torch.stack(
        [torch.randperm(num_timesteps, generator=generator, device=device)[:k] for _ in range(rows)]
    )


def old_decay(step: int, cap: float = 0.5, rate: float = 0.001, flat: int = 0) -> float:
    """Keep-fraction d for the old policy at `step`: 0 for the first `flat` steps, then
    min(rate * (step - flat), cap) (DiffusionNFT's schedule; its OCR recipe holds it flat for 75).

    Early on the old policy tracks the policy closely (d near 0); later it lags behind more
    (d up to `cap`), which steadies the implicit negative branch. A flat start keeps the old
    policy equal to the policy while the first, noisiest updates land.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if flat < 0:
        raise ValueError(f"flat must be >= 0, got {flat}")
    if step < flat:
        return 0.0
    return min(rate * (step - flat), cap)
