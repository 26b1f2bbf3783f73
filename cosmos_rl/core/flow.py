"""Rectified-flow conventions shared by DPO and NFT (pure tensor code, no model).

Convention (matches the Cosmos3 pipeline):
    x_t    = (1 - t) * x0 + t * eps,   t in [0, 1]  (t = 0 is data, t = 1 is noise)
    v      = eps - x0                   (velocity the network predicts)
    x0_hat = x_t - t * v_pred

`t` is one value per sample: a tensor of shape [B] (or a 0-dim tensor / float used for every
sample). It is reshaped to [B, 1, 1, ...] so it broadcasts over every non-batch dimension.

The network does not see `t` itself: it sees the integer timestep the Cosmos3 pipeline hands it,
`model_timesteps(t)`, times its `timestep_scale`. Every forward (rollout, v_old, v_ref, v_theta,
DPO) goes through that one function, so a training forward at a rollout's sigma sees exactly
the time the rollout's forward saw.
"""

from __future__ import annotations

import torch


def _per_sample(t: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """Shape `t` so it broadcasts over all non-batch dims of `like`, in `like`'s dtype/device."""
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    if t.dim() == 0:
        return t
    if t.dim() != 1 or t.shape[0] != like.shape[0]:
        # A [B, ...]-shaped t would broadcast silently against the wrong axes.
        raise ValueError(
            f"t must be a scalar or have shape [batch]=[{like.shape[0]}], got {tuple(t.shape)}"
        )
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def noisy_latents(x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
    """Forward process: interpolate each sample between data `x0` and noise `eps` at its `t`."""
    if x0.shape != eps.shape:
        raise ValueError(
            f"x0 and eps must have the same shape, got {tuple(x0.shape)} and {tuple(eps.shape)}"
        )
    tb = _per_sample(t, x0)
    return (1 - tb) * x0 + tb * eps


def velocity_target(x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Velocity the model is trained to predict: d x_t / d t = eps - x0 (independent of t)."""
    return eps - x0


def x0_from_velocity(x_t: torch.Tensor, t: torch.Tensor | float, v: torch.Tensor) -> torch.Tensor:
    """Clean-sample estimate implied by a velocity prediction `v` at noisy latents `x_t`."""
    return x_t - _per_sample(t, x_t) * v


def uniform_timesteps(
    n: int,
    generator: torch.Generator | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """`n` timesteps drawn i.i.d. from U[0, 1); pass a seeded generator for reproducible draws."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    gen_device = generator.device if generator is not None else device
    t = torch.rand(n, generator=generator, device=gen_device, dtype=dtype)
    return t.to(device) if device is not None else t


TIMESTEP_SAMPLING = ("uniform", "logit_normal")


def training_timesteps(
    n: int, generator: torch.Generator, sampling: str = "uniform", mean: float = 0.0, std: float = 1.0
) -> torch.Tensor:
    """`n` training timesteps (float32, on the generator's device) as rl.timestep_sampling says.

    uniform:      t ~ U[0, 1), one `torch.rand` draw (what DPO and SFT drew before the knob, the
                  same numbers from the same generator).
    logit_normal: t = sigmoid(mean + std * z), z ~ N(0, 1), one `torch.randn` draw (flow_grpo's DPO
                  and SD3's training: more weight on the middle times, where the velocity is hardest).
    By hand: z = 0 -> sigmoid(mean); mean 0, std 1, z = ln 3 -> 3 / 4.
    """
    if sampling == "uniform":
        return torch.rand(n, generator=generator)
    if sampling == "logit_normal":
        if not std > 0:
            raise ValueError(f"logit_std must be > 0, got {std}")
        return torch.sigmoid(mean + std * torch.randn(n, generator=generator))
    raise ValueError(f"timestep_sampling must be one of {list(TIMESTEP_SAMPLING)}, got {sampling!r}")


def model_timesteps(t: torch.Tensor, num_train_timesteps: int) -> torch.Tensor:
    """The integer timesteps the Cosmos3 pipeline feeds the transformer at flow times `t`: floor(N * t).

    UniPC in flow mode sets `timesteps = sigmas * N` in float64 and casts them to int64, which
    truncates, i.e. floors for t >= 0; the pipeline passes those integers and the model multiplies
    them by `timestep_scale` (1 / N). Any other t (a training draw from U[0, 1)) takes the same
    floor. Computed in float64 so that a float32 t is not rounded again on the way.

    By hand, N = 1000: t = 1.0 -> 1000; 0.9995 -> 999; 0.5004 -> 500; 0.0009 -> 0; 0.0 -> 0.
    (float32 0.7 is 0.699999988..., so it gives 699: pass the sampler's own sigmas, which
    `models.sampling` keeps consistent with the scheduler's integers.)
    """
    t = torch.as_tensor(t)
    if not t.is_floating_point():
        raise TypeError(f"t must be floating point flow times, got {t.dtype}")
    return torch.floor(t.double() * num_train_timesteps).long()
