"""Flow-GRPO: the stochastic sampler step, its Gaussian log-prob, the clipped objective, KL, advantages.

Pure functions of tensors (no model, no process groups). docs/grpo_math.md has the derivation; the
sampler loop and the choice of which steps are stochastic and which train are in `grpo_sampler`.

Convention (the project's, `cosmos_rl.core.flow`): x_s = (1 - s) x0 + s eps, sigma s runs from 1
(noise) to 0 (clean), the network predicts v = eps - x0. A sampler step goes from s to s' < s,
so dt = s' - s < 0. The marginal-preserving SDE of Flow-GRPO (Liu et al. 2025, arXiv 2505.05470)
in this convention, with noise level a (sigma_s = a * sqrt(s / (1 - s))) and the model's own
noise estimate eps_hat = x + (1 - s) v (= E[eps | x_s] for the exact velocity):

    mean = x + dt * (v + sigma_s^2 / (2 s) * eps_hat)
    std  = sigma_s * sqrt(-dt)
    x'   = mean + std * xi,   xi ~ N(0, I)

a = 0 is the Euler step of the ODE, x' = x + dt * v, exactly.

Endpoint rule: sigma_s is infinite at s = 1, and near 1 (the native Cosmos3 schedule starts at
s = 0.999) it would be huge (a * sqrt(999) = 22 for a = 0.7). The distance from pure noise in
sigma_s's denominator is therefore floored at the step's own size:

    sigma_s = a * sqrt(s / max(1 - s, s - s'))

At s = 1 this is Flow-GRPO's reference rule (which puts 1 - s' there for the first step only);
it is continuous in s, so a schedule starting just below 1 gets the same bounded first step; and
it changes nothing for a step no longer than its distance from pure noise (every step after the
first of a uniform schedule). Any positive per-step noise level keeps the marginals in the
continuous limit, so the floor only picks a finite member of the same family.

Coefficients-preserving sampling (CPS, Wang & Yu 2025, arXiv 2509.05952), the second rollout
step (`rl.scheduler = "cps"`): the Euler-Maruyama step above adds its noise by a first-order rule,
so over a coarse step near pure noise the sample leaves the step carrying more noise than its
sigma says (the paper's diagnosis of Flow-GRPO's noisy rollouts). CPS instead rebuilds x' from the
model's two estimates, x0_hat = x - s v and eps_hat = x + (1 - s) v, with coefficients whose
noise parts add up to exactly s' at any step size:

    std  = s' * sin(eta * pi / 2)
    mean = (1 - s') x0_hat + sqrt(s'^2 - std^2) eps_hat = (1 - s') x0_hat + s' cos(eta pi / 2) eps_hat

eta in (0, 1] replaces a fresh share of the noise direction: eta -> 0 tends to the Euler ODE step
x + (s' - s) v, eta = 1 puts x0_hat at s' with all-new noise.
A step to s' = 0 has no noise and so no log-prob (the last step is the ODE's anyway).

Log-probs and the KL are per-sample MEANS over the latent elements, as Flow-GRPO's reference
code reduces them; the clip range is read against that scale (docs/grpo_math.md, "Defaults").

Conditioned clips (image to video, a continued clip, forward dynamics): the first `clean_frames`
latent frames (axis 2 of [B, C, T, h, w]) are given, held clean by the sampler and no action of
the policy, so `step_log_prob`, `gaussian_kl` and `step_kl` take `clean_frames` and reduce over
the GENERATED elements only: the per-sample mean over the latent frames from `clean_frames` on.
The ratio and the loss are built from those, so the given frames are outside all of them. With
clean_frames = 0 (images, text to video) nothing is sliced: the numbers are the image ones, bit
for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from cosmos_rl.algorithms.multi_reward import combined_advantages
from cosmos_rl.algorithms.nft import clamp_advantages

DEFAULT_NOISE_LEVEL = 0.7  # Flow-GRPO's `a` (its configs' sample.noise_level)
DEFAULT_CLIP_RANGE = 1e-4  # Flow-GRPO's base config train.clip_range
DEFAULT_KL_BETA = 0.04  # Flow-GRPO's GenEval and OCR configs (train.beta)
DEFAULT_ADVANTAGE_CLIP = 5.0  # Flow-GRPO's train.adv_clip_max
DEFAULT_ADVANTAGE_EPS = 1e-4  # added to the std, as Flow-GRPO's per-prompt tracker does

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    # bf16 overflows in the drift; float64 callers (tests) keep their precision.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _per_sample(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """`value` (a float or 0-dim tensor, kept 0-dim; or one value per sample [B]) as [B, 1, ..., 1]."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.dim() == 0:
        return t
    if t.dim() != 1 or t.shape[0] != like.shape[0]:
        # A [B, ...]-shaped sigma would broadcast silently against the wrong axes.
        raise ValueError(f"sigma must be a scalar or shaped [B]=[{like.shape[0]}], got {tuple(t.shape)}")
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def _step_inputs(x: torch.Tensor, v: torch.Tensor, s, s_next):
    """A step's x and v in the work dtype and its sigmas broadcast per sample (both step rules)."""
    if x.shape != v.shape or x.dim() < 1:
        raise ValueError(f"x and v must share one [B, ...] shape, got {tuple(x.shape)} and {tuple(v.shape)}")
    work = _work_dtype(x)
    x, v = x.to(work), v.to(work)
    return x, v, _per_sample(s, x), _per_sample(s_next, x)


def sde_sigma(s: torch.Tensor, s_next: torch.Tensor, a: float) -> torch.Tensor:
    """Flow-GRPO's noise level sigma_s = a * sqrt(s / max(1 - s, s - s')) for a step s -> s'.

    s, s_next: tensors of one shape (any), 0 < s <= 1, 0 <= s_next < s. Returns that shape.
    The max() is the endpoint rule of the module docstring (finite at s = 1).
    By hand, a = 0.5: (s, s') = (0.5, 0.25) -> 0.5 * sqrt(0.5 / 0.5) = 0.5;
    (1, 0.75) -> 0.5 * sqrt(1 / 0.25) = 1.
    """
    if not a >= 0:
        raise ValueError(f"noise level a must be >= 0, got {a}")
    if not bool(((s > 0) & (s <= 1)).all()):
        raise ValueError(f"sigma must lie in (0, 1], got {s.flatten().tolist()}")
    if not bool(((s_next >= 0) & (s_next < s)).all()):
        raise ValueError(
            f"the next sigma must lie in [0, sigma), got {s_next.flatten().tolist()} after {s.flatten().tolist()}"
        )
    return a * torch.sqrt(s / torch.maximum(1 - s, s - s_next))


def sde_step_mean_std(
    x: torch.Tensor, v: torch.Tensor, s: torch.Tensor | float, s_next: torch.Tensor | float, a: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [B, ...] and std [B] of the Euler-Maruyama step from sigma s to s' < s.

    x: latents at s, [B, ...]; v: the (guided) velocity predicted there, same shape; s, s_next:
    floats or [B] tensors. mean = x + dt * (v + sigma_s^2 / (2 s) * (x + (1 - s) v)),
    std = sigma_s * sqrt(s - s'), sigma_s from `sde_sigma`. Computed in float32 (float64 if x is).
    The mean is differentiable in v (the policy's output); the std depends on the schedule only.
    By hand, a = 0.5, s = 0.5, s' = 0.25, x = 2, v = 1: sigma_s = 0.5, eps_hat = 2.5,
    drift = 1 + 0.25 * 2.5 = 1.625, mean = 2 - 0.25 * 1.625 = 1.59375, std = 0.5 * 0.5 = 0.25.
    """
    x, v, s_b, s_next_b = _step_inputs(x, v, s, s_next)
    sigma = sde_sigma(s_b, s_next_b, a)
    dt = s_next_b - s_b
    eps_hat = x + (1 - s_b) * v
    mean = x + dt * (v + sigma.pow(2) / (2 * s_b) * eps_hat)
    std = (sigma * torch.sqrt(-dt)).reshape(-1).expand(x.shape[0]).contiguous()
    return mean, std


def cps_step_mean_std(
    x: torch.Tensor, v: torch.Tensor, s: torch.Tensor | float, s_next: torch.Tensor | float, eta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [B, ...] and std [B] of the coefficients-preserving step from sigma s to s' (module docstring).

    x, v, s, s_next and the dtype rules as `sde_step_mean_std`; 0 < s' < s <= 1 (a step to 0 has
    no noise), 0 < eta <= 1. The mean is differentiable in v; the std depends on the schedule only.
    By hand, s = 0.5, s' = 0.25, x = 2, v = 1: x0_hat = 1.5, eps_hat = 2.5; eta = 1: std = 0.25,
    mean = 0.75 * 1.5 = 1.125; eta = 1/3: std = 0.25 * 0.5 = 0.125,
    mean = 1.125 + 0.25 * (sqrt(3) / 2) * 2.5 = 1.6662658.
    """
    if not 0 < eta <= 1:
        raise ValueError(f"the CPS noise level eta must be in (0, 1], got {eta}")
    x, v, s_b, s_next_b = _step_inputs(x, v, s, s_next)
    if not bool(((s_b > 0) & (s_b <= 1)).all()):
        raise ValueError(f"sigma must lie in (0, 1], got {s_b.flatten().tolist()}")
    if not bool(((s_next_b > 0) & (s_next_b < s_b)).all()):
        raise ValueError(
            f"the next sigma must lie in (0, sigma) for a CPS step (a step to 0 has no noise), "
            f"got {s_next_b.flatten().tolist()} after {s_b.flatten().tolist()}"
        )
    x0_hat = x - s_b * v
    eps_hat = x + (1 - s_b) * v
    angle = eta * math.pi / 2
    mean = (1 - s_next_b) * x0_hat + s_next_b * math.cos(angle) * eps_hat
    std = (s_next_b * math.sin(angle)).reshape(-1).expand(x.shape[0]).contiguous()
    return mean, std


# rl.scheduler -> the step's (mean, std) function of (x, v, s, s_next, noise level)
STEP_DYNAMICS = {"sde": sde_step_mean_std, "cps": cps_step_mean_std}


def step_mean_std(
    dynamics: str, x: torch.Tensor, v: torch.Tensor, s: torch.Tensor | float, s_next: torch.Tensor | float, level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stochastic step's (mean, std) under `dynamics` (a key of STEP_DYNAMICS)."""
    try:
        fn = STEP_DYNAMICS[dynamics]
    except KeyError:
        raise ValueError(f"unknown step dynamics {dynamics!r}; known: {sorted(STEP_DYNAMICS)}") from None
    return fn(x, v, s, s_next, level)


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    s: torch.Tensor | float,
    s_next: torch.Tensor | float,
    a: float,
    noise: torch.Tensor,
    dynamics: str = "sde",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One stochastic step: (x_next, mean, std) with x_next = mean + std * noise.

    noise: standard normal, shaped like x. Shapes and dtype as `sde_step_mean_std`; a: the noise
    level of `dynamics` ("sde": Flow-GRPO's a; "cps": eta, `cps_step_mean_std`).
    """
    if noise.shape != x.shape:
        raise ValueError(f"noise must be shaped like x {tuple(x.shape)}, got {tuple(noise.shape)}")
    mean, std = step_mean_std(dynamics, x, v, s, s_next, a)
    return mean + _per_sample(std, mean) * noise.to(mean.dtype), mean, std


def generated(t: torch.Tensor, clean_frames: int) -> torch.Tensor:
    """The generated part of latents [B, C, T, h, w]: every latent frame from `clean_frames` on
    (the leading ones are a condition's, held clean). clean_frames = 0 returns `t` itself."""
    if not clean_frames:
        return t
    if t.dim() != 5 or not 0 < clean_frames < t.shape[2]:
        raise ValueError(f"clean_frames = {clean_frames} must leave a generated latent frame of [B, C, T, h, w] latents, got {tuple(t.shape)}")
    return t[:, :, clean_frames:]


def step_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, clean_frames: int = 0) -> torch.Tensor:
    """Per-sample log-density [B] of the taken step x_next under N(mean, std^2 I), MEAN over the
    generated elements (every element; with clean_frames > 0 those of the latent frames from
    clean_frames on, `generated`: a condition's frames are no action and add nothing).

    logp = mean_i [ -(x_next_i - mean_i)^2 / (2 std^2) - log std - log(2 pi) / 2 ]
    x_next is the action taken (detached: a constant of the objective); the gradient reaches the
    policy through `mean`. std [B] must be > 0 (an ODE step, a = 0, has no density).
    By hand: x_next = 1, mean = 0.5, std = 0.5 -> -0.5 + log 2 - 0.9189385 = -0.7257914;
    d logp / d mean = (x_next - mean) / (std^2 * D) with D the elements per sample.
    """
    if x_next.shape != mean.shape:
        raise ValueError(f"x_next and mean must share one shape, got {tuple(x_next.shape)} and {tuple(mean.shape)}")
    if std.shape != (mean.shape[0],):
        raise ValueError(f"std must be shaped [B]=[{mean.shape[0]}], got {tuple(std.shape)}")
    if not bool((std > 0).all()):
        raise ValueError(f"std must be > 0 (an ODE step has no log-prob), got {std.tolist()}")
    x_next, mean = generated(x_next, clean_frames), generated(mean, clean_frames)
    std = std.to(mean.dtype)
    z = x_next.detach().to(mean.dtype) - mean
    # The constant terms are per sample: only the squared error varies over the elements.
    squared = (z.pow(2).flatten(1).mean(dim=1)) / (2 * std.pow(2))
    return -squared - torch.log(std) - _HALF_LOG_2PI


def update_slices(n_rows: int, updates: int) -> list[slice]:
    """The rows of a step's batch each of its `updates` optimizer steps trains: `updates` equal,
    contiguous slices in order. By hand: 32 rows, 2 updates -> [0:16], [16:32]; 6 rows, 3 -> [0:2],
    [2:4], [4:6]; 32 rows, 1 -> [0:32]; 6 rows, 4 -> refused (preflight asks that it divide)."""
    if updates < 1 or n_rows % updates:
        raise ValueError(f"{updates} updates do not split {n_rows} rows evenly")
    size = n_rows // updates
    return [slice(i * size, (i + 1) * size) for i in range(updates)]


def policy_ratio(logp_new: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """exp(logp_new - logp_old) per sample [B]; logp_old (the sampling policy's) is detached."""
    if logp_new.shape != logp_old.shape:
        raise ValueError(
            f"logp_new and logp_old must share one shape, got {tuple(logp_new.shape)} and {tuple(logp_old.shape)}"
        )
    return torch.exp(logp_new - logp_old.detach())


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float,
                      clip_range_high: float | None = None) -> torch.Tensor:
    """PPO's pessimistic clipped loss per sample [B]: max(-A r, -A clip(r, 1 - eps, 1 + eps_high)),
    eps_high = eps unless given (DAPO's "clip-higher": a wider upper bound lets a rare good step's
    probability grow further before its gradient stops).

    With A > 0 the gradient stops once r > 1 + eps_high (nothing more to gain from pushing it up)
    but not below 1 - eps; with A < 0 the other way round. By hand, eps = 0.2:
    A = 1, r = 1.5 -> max(-1.5, -1.2) = -1.2 (clipped, no gradient); A = 1, r = 0.5 -> -0.5;
    A = -1, r = 1.5 -> 1.5; A = -1, r = 0.5 -> max(0.5, 0.8) = 0.8 (clipped).
    """
    high = clip_range if clip_range_high is None else clip_range_high
    if not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    if not high > 0:
        raise ValueError(f"clip_range_high must be > 0, got {high}")
    if ratio.shape != advantages.shape or ratio.dim() != 1:
        raise ValueError(
            f"ratio and advantages must both be shaped [B], got {tuple(ratio.shape)} and {tuple(advantages.shape)}"
        )
    a = advantages.detach().to(ratio.dtype)
    clipped = ratio.clamp(1 - clip_range, 1 + high)
    return torch.maximum(-a * ratio, -a * clipped)


def outside(ratio: torch.Tensor, clip_range: float, clip_range_high: float | None = None) -> torch.Tensor:
    """Which ratios lie outside the clip interval [1 - clip_range, 1 + clip_range_high] (bool, as `ratio`)."""
    high = clip_range if clip_range_high is None else clip_range_high
    return (ratio < 1 - clip_range) | (ratio > 1 + high)


def ema_warmup_decay(optimizer_steps: int, decay: float) -> float:
    """The moving average's decay after `optimizer_steps` optimizer steps with Flow-GRPO's warm-up
    (its EMA wrapper, as diffusers' EMAModel): min((1 + t) / (10 + t), decay). Early averages follow
    the policy (t = 0: 0.1), so the average does not sit near the base for the run's first hundred
    steps. By hand: t = 0 -> 0.1, t = 8 -> 0.5, t = 80 with decay 0.9 -> min(81/90, 0.9) = 0.9."""
    if optimizer_steps < 0:
        raise ValueError(f"optimizer_steps must be >= 0, got {optimizer_steps}")
    return min((1 + optimizer_steps) / (10 + optimizer_steps), decay)


def gaussian_kl(mean: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor, clean_frames: int = 0) -> torch.Tensor:
    """KL(N(mean, std^2) || N(mean_ref, std^2)) per sample [B], MEAN over the generated elements
    (as `step_log_prob`: with clean_frames > 0 the condition's leading latent frames are left out).

    Two Gaussians of one std differ only in the mean: KL = mean_i (mean_i - mean_ref_i)^2 / (2 std^2).
    mean_ref (the frozen reference's step mean) is detached. Pass the step's std (sigma_s *
    sqrt(-dt), what `sde_step_mean_std` returns) for the true KL of the two steps, the paper's
    formula. Flow-GRPO's reference code divides by sigma_s^2 instead (no dt), i.e. its KL is this
    one times (s - s'): pass std / sqrt(s - s') to get its number.
    By hand: mean [1, 3], mean_ref [0, 1], std 2 -> (1 + 4) / 2 / 8 = 0.3125.
    """
    if mean.shape != mean_ref.shape:
        raise ValueError(f"mean and mean_ref must share one shape, got {tuple(mean.shape)} and {tuple(mean_ref.shape)}")
    if std.shape != (mean.shape[0],) or not bool((std > 0).all()):
        raise ValueError(f"std must be shaped [B]=[{mean.shape[0]}] and > 0, got {std.tolist()}")
    mean, mean_ref = generated(mean, clean_frames), generated(mean_ref, clean_frames)
    diff = mean - mean_ref.detach().to(mean.dtype)
    return diff.pow(2).flatten(1).mean(dim=1) / (2 * std.to(mean.dtype).pow(2))


# rl.kl_form: how the KL term scales with the step size.
KL_FORMS = ("exact", "reference")


def step_kl(
    mean: torch.Tensor,
    mean_ref: torch.Tensor,
    std: torch.Tensor,
    s: torch.Tensor | float,
    s_next: torch.Tensor | float,
    form: str = "exact",
    dynamics: str = "sde",
    clean_frames: int = 0,
) -> torch.Tensor:
    """The KL term per sample [B] of one trained step, as rl.kl_form says (MEAN over the generated
    elements: the condition's first `clean_frames` latent frames left out, `gaussian_kl`).

    exact:     `gaussian_kl(mean, mean_ref, std)`, the true KL of the two step Gaussians (the paper's).
    reference: what Flow-GRPO's reference code computes, mean((mean - mean_ref)^2) / (2 std_dev_t^2)
               with its scheduler's std_dev_t: for the `sde` step that is sigma_s, without the step
               size, so the reference KL is the exact one times (s - s') (the same kl_beta pulls
               1 / (s - s') times harder in `exact`: 4-28x at 10 steps); for the `cps` step its
               std_dev_t is the step's own std s' sin(eta pi / 2), and the two forms agree.
    s, s_next: the step's sigmas (floats or 0-dim tensors, one step for the whole batch).
    By hand, sde: mean [1, 3], mean_ref [0, 1], std 2, s = 0.5, s' = 0.25: exact 0.3125,
    reference 0.3125 * 0.25 = 0.078125.
    """
    if form not in KL_FORMS:
        raise ValueError(f"kl_form must be one of {list(KL_FORMS)}, got {form!r}")
    if dynamics not in STEP_DYNAMICS:
        raise ValueError(f"unknown step dynamics {dynamics!r}; known: {sorted(STEP_DYNAMICS)}")
    kl = gaussian_kl(mean, mean_ref, std, clean_frames)
    if form == "exact" or dynamics == "cps":
        return kl
    step = torch.as_tensor(s, dtype=kl.dtype, device=kl.device) - torch.as_tensor(s_next, dtype=kl.dtype, device=kl.device)
    return kl * step


def grpo_advantages(
    rewards: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    mode: str,
    std_scope: str = "group",
    eps: float = DEFAULT_ADVANTAGE_EPS,
    clip_max: float | None = DEFAULT_ADVANTAGE_CLIP,
) -> torch.Tensor:
    """Group-relative advantages [num_prompts, group_size] from reward tables of that shape.

    Several rewards combine as NFT's do (`multi_reward.combined_advantages`, `mode` =
    "weighted_sum" or "normalised_sum"); each is normalised as (R - prompt's group mean) /
    (std + eps). std_scope "group" (default) is the paper's per-prompt std; "batch" is one std
    over all rewards, what Flow-GRPO's SD3 configs run (global_std = True). Then the advantages
    are clamped to [-clip_max, clip_max] (Flow-GRPO's adv_clip_max = 5; None leaves them).
    A constant group gets 0.
    """
    advantages = combined_advantages(rewards, weights, mode, std_scope=std_scope, eps=eps)
    if clip_max is None:
        return advantages
    return clamp_advantages(advantages, -clip_max, clip_max)


def grpo_step_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    kl: torch.Tensor | None,
    clip_range: float = DEFAULT_CLIP_RANGE,
    kl_beta: float = DEFAULT_KL_BETA,
    clip_range_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one trained sampler step for a batch of B samples, and its metrics.

        ratio       = exp(logp_new - logp_old)                        [B]
        policy_loss = mean(clipped_surrogate(ratio, A, clip_range, clip_range_high))
        kl_loss     = mean(kl)                                        (kl from `gaussian_kl`, [B])
        loss        = policy_loss + kl_beta * kl_loss

    logp_new: the policy's `step_log_prob` of the taken step (with grad); logp_old: the sampling
    policy's (detached); advantages: one per sample [B] (a sample's advantage at every one of its
    steps). kl = None (only with kl_beta = 0) leaves the KL out, and `kl_loss` out of the metrics.
    Metrics (detached 0-dim tensors): loss, policy_loss, kl_loss (when kl), ratio_mean,
    clip_fraction (share of samples with the ratio outside [1 - clip_range, 1 + clip_range_high]), approx_kl
    (0.5 * mean((logp_new - logp_old)^2), the usual estimate of KL(old || new)).
    """
    if kl is None and kl_beta != 0:
        raise ValueError(f"kl is needed for kl_beta = {kl_beta}")
    if not kl_beta >= 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl is not None and kl.shape != logp_new.shape:
        raise ValueError(f"kl must be shaped like logp_new {tuple(logp_new.shape)}, got {tuple(kl.shape)}")
    ratio = policy_ratio(logp_new, logp_old)
    policy_loss = clipped_surrogate(ratio, advantages, clip_range, clip_range_high).mean()
    loss = policy_loss
    metrics = {"policy_loss": policy_loss.detach()}
    if kl is not None:
        kl_loss = kl.mean()
        loss = policy_loss + kl_beta * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    log_ratio = (logp_new - logp_old).detach()
    return loss, {
        "loss": loss.detach(),
        **metrics,
        "ratio_mean": ratio.detach().mean(),
        "clip_fraction": outside(ratio.detach(), clip_range, clip_range_high).to(ratio.dtype).mean(),
        "approx_kl": 0.5 * log_ratio.pow(2).mean(),
    }
