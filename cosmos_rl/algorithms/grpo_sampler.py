"""Flow-GRPO's rollout sampler and its step choices: which steps are stochastic, which train.

Pure torch over a velocity callable (no model, no scheduler object): the trainer wraps its
network, prompts and guidance into `velocity_fn(x, sigma[B]) -> v`. The step math is
`algorithms.grpo`'s; conventions (sigma from 1 = noise to 0 = clean, v = eps - x0) are the
project's.

A sampler of N steps runs over sigmas [N + 1], sigmas[0] <= 1 down to sigmas[N] = 0. Step k goes
from sigmas[k] to sigmas[k + 1]. A step is either the SDE step (stochastic, has a log-prob, can
train) or the plain Euler step of the ODE. The last step (to sigma 0) is always an ODE step here:
Flow-GRPO never trains it (its timestep_fraction 0.99 trains floor(0.99 N) = N - 1 steps), and
as an SDE step it would leave Gaussian noise in the sample the reward scores.

Two ways to choose the steps:
- Flow-GRPO: every step but the last is SDE (`default_sde_steps`); the first
  floor(timestep_fraction * N) steps train (`train_steps`), in sampler order, as the reference
  code trains them (no per-sample shuffle).
- Flow-GRPO-Fast (Flow-GRPO paper v3 and its reference code): an SDE window of k consecutive
  steps (k = 1-2 in the paper, 2 in the reference's base config) at a start drawn uniformly from
  a range each rollout (`draw_window_start`, `sde_window`); ODE elsewhere; exactly the window trains.

Conditioned clips (`condition`: image to video, a continued clip, forward dynamics): the given
leading latent frames are written over the noise and written back after every step, ODE and SDE
alike (as `models.generate` holds them for NFT and the stock pipeline), so the sample keeps them
exactly; every step, SDE included, moves all the other latent frames. A record's log-prob is the
generated frames' alone (`grpo.step_log_prob`'s clean_frames): the given frames are no action.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cosmos_rl.algorithms.grpo import sde_step, step_log_prob

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

DEFAULT_TIMESTEP_FRACTION = 0.99  # Flow-GRPO's task configs: every step but the last trains
DEFAULT_WINDOW_SIZE = 2  # Flow-GRPO's base config sample.sde_window_size (the paper: 1-2)

# floor(f * N) of e.g. 0.29 * 100 is 28.999999999999996 in floating point: treat it as 29.
_FRACTION_SLACK = 1e-9


@dataclass(frozen=True)
class SDEStepRecord:
    """One SDE step of a rollout, what the trainer needs to recompute its log-prob.

    index: the step's place in the sampler (0 = the first, from sigmas[0]); sigma, sigma_next:
    0-dim tensors; x: latents the step started from [B, ...]; mean [B, ...], std [B]: the sampling
    policy's step distribution; x_next: the latents taken [B, ...]; log_prob [B]:
    `step_log_prob(x_next, mean, std, clean_frames)`, the old (sampling) policy's log-prob;
    clean_frames: the leading latent frames a condition holds clean (0: none), which x and x_next
    hold exactly and which no log-prob, ratio, KL or loss of the step reads.
    """

    index: int
    sigma: torch.Tensor
    sigma_next: torch.Tensor
    x: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    x_next: torch.Tensor
    log_prob: torch.Tensor
    clean_frames: int = 0

    def rows(self, rows: slice) -> "SDEStepRecord":
        """The same step for the samples `rows` of the batch (rl.updates_per_step's slices)."""
        return SDEStepRecord(self.index, self.sigma, self.sigma_next, self.x[rows], self.mean[rows],
                             self.std[rows], self.x_next[rows], self.log_prob[rows], self.clean_frames)


def _check_steps(num_steps: int) -> None:
    if num_steps < 2:
        raise ValueError(f"num_steps must be >= 2 (the last step is the ODE's), got {num_steps}")


def default_sde_steps(num_steps: int) -> list[int]:
    """Flow-GRPO's stochastic steps: every step but the last, [0, ..., N - 2]."""
    _check_steps(num_steps)
    return list(range(num_steps - 1))


def train_steps(num_steps: int, timestep_fraction: float = DEFAULT_TIMESTEP_FRACTION) -> list[int]:
    """The steps that train in plain Flow-GRPO: the first floor(f * N) of the N sampler steps.

    Must be between 1 and N - 1 steps (the last step is the ODE's and has no log-prob), so
    f * N >= 1 and f < 1 for N <= 100 at Flow-GRPO's default f = 0.99. By hand: N = 10,
    f = 0.99 -> floor(9.9) = 9 -> [0..8]; f = 0.5 -> [0..4]; f = 1.0 -> 10 steps, refused.
    """
    _check_steps(num_steps)
    if not 0 < timestep_fraction <= 1:
        raise ValueError(f"timestep_fraction must be in (0, 1], got {timestep_fraction}")
    k = math.floor(timestep_fraction * num_steps + _FRACTION_SLACK)
    if not 1 <= k <= num_steps - 1:
        raise ValueError(
            f"timestep_fraction {timestep_fraction} of {num_steps} steps trains {k} steps; it must train "
            f"between 1 and {num_steps - 1} (the last step, to sigma 0, is an ODE step)"
        )
    return list(range(k))


def sde_window(num_steps: int, window_size: int, start: int) -> list[int]:
    """Flow-GRPO-Fast's SDE (and training) steps: [start, start + window_size), inside [0, N - 2]."""
    _check_steps(num_steps)
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    if start < 0 or start + window_size > num_steps - 1:
        raise ValueError(
            f"SDE window [{start}, {start + window_size}) must lie in steps [0, {num_steps - 1}) "
            f"of {num_steps} (the last step is an ODE step)"
        )
    return list(range(start, start + window_size))


def draw_window_start(
    num_steps: int,
    window_size: int,
    generator: torch.Generator,
    window_range: tuple[int, int] | None = None,
) -> int:
    """A window start drawn uniformly from [lo, hi - window_size], so the window lies in [lo, hi).

    window_range (lo, hi): the steps the window may cover, default (0, N - 1), i.e. every step
    but the last. Flow-GRPO-Fast's reference draws the start the same way (its no-CFG configs
    use (0, N // 2), the early, high-noise half). One draw from `generator` per call.
    """
    _check_steps(num_steps)
    lo, hi = (0, num_steps - 1) if window_range is None else window_range
    if not 0 <= lo < hi <= num_steps - 1 or hi - lo < window_size or window_size < 1:
        raise ValueError(
            f"window_range ({lo}, {hi}) must lie in [0, {num_steps - 1}] and hold a window of "
            f"{window_size} >= 1 steps"
        )
    start = int(torch.randint(lo, hi - window_size + 1, (1,), generator=generator, device=generator.device))
    return start


def _check_sigmas(sigmas: torch.Tensor) -> None:
    if sigmas.dim() != 1 or sigmas.shape[0] < 2:
        raise ValueError(f"sigmas must be shaped [N + 1] with N >= 1, got {tuple(sigmas.shape)}")
    if not (float(sigmas[0]) <= 1 and float(sigmas[-1]) == 0 and bool((sigmas[1:] < sigmas[:-1]).all())):
        raise ValueError(f"sigmas must decrease strictly from at most 1 to exactly 0, got {sigmas.tolist()}")


@torch.no_grad()
def sample_sde(
    velocity_fn: VelocityFn,
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    a: float,
    generator: torch.Generator,
    sde_steps: Sequence[int] | None = None,
    dynamics: str = "sde",
    condition: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[SDEStepRecord]]:
    """Integrate from `noise` (at sigmas[0]) to sigma 0; returns (x0 [B, ...], one record per SDE step).

    velocity_fn(x [B, ...], sigma [B]) -> v [B, ...]. sigmas: [N + 1], strictly decreasing,
    sigmas[0] <= 1, sigmas[N] = 0. a: the noise level of `dynamics` ("sde": Flow-GRPO's
    Euler-Maruyama step, a as in `grpo.sde_sigma`; "cps": the coefficients-preserving step, a is
    its eta in (0, 1], `grpo.cps_step_mean_std`). sde_steps: which step
    indices use the SDE (None = `default_sde_steps(N)`); the rest are Euler ODE steps
    x' = x + (s' - s) v (sde_steps = [] is the plain Euler ODE sampler). Each SDE step draws its
    standard normal noise, shaped like x, from `generator` (on the generator's device), in step
    order, and nothing else draws from it.
    Latents are carried in float32 (float64 if noise is); x0 is returned in noise's dtype. The
    sigmas reach velocity_fn as given (float32 sigmas stay bit-identical), so a schedule made
    consistent with the model's integer timesteps stays so.
    condition: clean latents [B, C, k, h, w] of the first k latent frames of noise [B, C, T, h, w]
    (k < T), held as the module docstring says; the records' log-probs leave them out. Their noise
    is still drawn (one xi shaped like x per SDE step), so the draws are those of the unconditioned
    sampler.
    """
    _check_sigmas(sigmas)
    num_steps = sigmas.shape[0] - 1
    chosen = set(default_sde_steps(num_steps) if sde_steps is None else sde_steps)
    if not chosen <= set(range(num_steps)):
        raise ValueError(f"sde_steps {sorted(chosen)} must be step indices in [0, {num_steps})")
    if chosen and not a > 0:
        raise ValueError(f"SDE steps need a noise level a > 0 (got {a}); sde_steps = [] runs the ODE")
    work = torch.float64 if noise.dtype == torch.float64 else torch.float32
    sigmas = sigmas.to(device=noise.device, dtype=work)
    batch = noise.shape[0]
    x = noise.to(work)
    clean = 0
    if condition is not None:
        clean = int(condition.shape[2]) if condition.dim() == 5 else 0
        if noise.dim() != 5 or condition.shape[:2] != noise.shape[:2] or condition.shape[3:] != noise.shape[3:] or not 0 < clean < noise.shape[2]:
            raise ValueError(f"condition must be [B, C, k, h, w] with 0 < k < T of noise {tuple(noise.shape)}, got {tuple(condition.shape)}")
        given = condition.to(device=x.device, dtype=work)
        x = x.clone()  # never write into the caller's noise
        x[:, :, :clean] = given
    records = []
    for k in range(num_steps):
        s, s_next = sigmas[k], sigmas[k + 1]
        v = velocity_fn(x, s.expand(batch)).to(work)
        if k not in chosen:
            x = x + (s_next - s) * v
            if clean:
                x[:, :, :clean] = given
            continue
        xi = torch.randn(x.shape, generator=generator, device=generator.device, dtype=work).to(x.device)
        x_next, mean, std = sde_step(x, v, s, s_next, a, xi, dynamics)
        if clean:
            x_next[:, :, :clean] = given
        records.append(SDEStepRecord(k, s, s_next, x, mean, std, x_next, step_log_prob(x_next, mean, std, clean), clean))
        x = x_next
    return x.to(noise.dtype), records
