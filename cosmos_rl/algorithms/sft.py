"""SFT losses: flow matching for the transformer, reconstruction for the VAE. Pure tensor functions.

Flow matching (rectified flow, the convention of `cosmos_rl.core.flow`): for clean latents x0, noise eps
and t in [0, 1], the network sees x_t = (1 - t) x0 + t eps and is trained to predict v = eps - x0;
the loss is the mean squared error over every element of the batch.

    x0 = [[1, 2]], eps = [[3, 2]] -> target v = [[2, 0]]; a prediction [[1, 0]] has loss
    ((1 - 2)^2 + 0^2) / 2 = 0.5.

The VAE is trained as an autoencoder on pixels in the VAE's [-1, 1] range (the decoded posterior
mean against the input), and reports PSNR on the [0, 1] image range: an MSE of m on [-1, 1] is
m / 4 on [0, 1], so PSNR = 10 log10(4 / m); m = 0.04 -> 10 log10(100) = 20 dB.

On data with a plain background and small objects (the shapes worlds), plain MSE lets a VAE settle
on the background colour everywhere; weighting the foreground pixels (those whose colour differs
from their frame's per-channel median) by `w` and taking the weighted mean escapes that:

    target pixels [0, 0, 0, 1] (median 0, so the last is foreground), decoded [0, 0, 0, 0], w = 9
    -> weights [1, 1, 1, 9], loss (9 * 1^2) / (1 + 1 + 1 + 9) = 0.75 (plain MSE: 0.25).
"""

from __future__ import annotations

import math

import torch


def flow_matching_loss(
    v_pred: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, clean_frames: list[int] | None = None
) -> torch.Tensor:
    """Mean squared error between the predicted velocity and eps - x0 (all [B, ...], same shape).

    `clean_frames` (latents [B, C, T, h, w] only): per sample, how many leading latent frames are
    clean conditions (image-to-video); they are left out, and the mean is over the remaining
    elements of the batch: one sample of two one-element latent frames with squared errors 4 and 1
    and one clean frame has loss 1 (not (4 + 1) / 2)."""
    if not v_pred.shape == x0.shape == eps.shape:
        raise ValueError(f"shapes differ: v_pred {tuple(v_pred.shape)}, x0 {tuple(x0.shape)}, eps {tuple(eps.shape)}")
    squared = (v_pred.float() - (eps - x0).float()) ** 2
    if not clean_frames or not any(clean_frames):
        return torch.mean(squared)
    if x0.dim() != 5 or len(clean_frames) != x0.shape[0]:
        raise ValueError(f"clean_frames needs one count per sample of [B, C, T, h, w] latents, got {clean_frames} for {tuple(x0.shape)}")
    frames = torch.arange(x0.shape[2], device=x0.device)
    noisy = frames[None, :] >= torch.tensor(clean_frames, device=x0.device)[:, None]  # [B, T]
    mask = noisy[:, None, :, None, None].expand_as(squared)
    return squared[mask].mean()


def action_flow_loss(
    v_pred: torch.Tensor, a0: torch.Tensor, eps: torch.Tensor, clean_rows: list[int], widths: list[int]
) -> torch.Tensor:
    """Flow matching on action rows (the world model's generated actions): the mean squared error
    between the predicted velocity and eps - a0 (all [B, rows, action_dim]) over each sample's
    noisy rows (from `clean_rows[b]` on) and its embodiment's `widths[b]` raw columns; clean rows
    (given actions) and the zero padding columns are in no loss.

        one sample, rows 2, action_dim 3, width 2, clean_rows 1: a0 = 0, eps = [[9, 9, 9], [1, 2, 9]],
        v_pred = [[0, 0, 0], [0, 0, 0]] -> only row 1's first two columns count: (1 + 4) / 2 = 2.5.
    """
    if not v_pred.shape == a0.shape == eps.shape or v_pred.dim() != 3:
        raise ValueError(f"action rows must be [B, rows, action_dim] alike: v_pred {tuple(v_pred.shape)}, a0 {tuple(a0.shape)}, eps {tuple(eps.shape)}")
    batch, rows, columns = v_pred.shape
    if len(clean_rows) != batch or len(widths) != batch:
        raise ValueError(f"one clean-row count and width per sample: {clean_rows}, {widths} for a batch of {batch}")
    row_index = torch.arange(rows, device=v_pred.device)[None, :, None]
    column_index = torch.arange(columns, device=v_pred.device)[None, None, :]
    clean = torch.tensor(clean_rows, device=v_pred.device)[:, None, None]
    width = torch.tensor(widths, device=v_pred.device)[:, None, None]
    mask = (row_index >= clean) & (column_index < width)
    if not bool(mask.any()):
        raise ValueError("no action row is noisy: every row is given (forward dynamics trains no action loss)")
    squared = (v_pred.float() - (eps - a0).float()) ** 2
    return squared[mask.expand_as(squared)].mean()


def reconstruction_loss(decoded: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of a reconstruction, both in the VAE's [-1, 1] pixel range."""
    if decoded.shape != target.shape:
        raise ValueError(f"shapes differ: decoded {tuple(decoded.shape)}, target {tuple(target.shape)}")
    return torch.mean((decoded.float() - target.float()) ** 2)


FOREGROUND_THRESHOLD = 0.1  # on [-1, 1]: 0.05 of the [0, 1] range, far below any colour step of the worlds


def foreground_mask(target: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, F, H, W] of clips [B, C, F, H, W]: pixels whose value differs from their frame's
    per-channel median by more than FOREGROUND_THRESHOLD in any channel."""
    if target.dim() != 5:
        raise ValueError(f"foreground_mask needs [B, C, F, H, W], got {tuple(target.shape)}")
    median = target.flatten(3).median(dim=3).values[..., None, None]
    return ((target - median).abs() > FOREGROUND_THRESHOLD).any(dim=1, keepdim=True)


def weighted_reconstruction_loss(decoded: torch.Tensor, target: torch.Tensor, foreground_weight: float) -> torch.Tensor:
    """The reconstruction MSE with foreground pixels (`foreground_mask` of the target) weighted
    `foreground_weight` against 1 for the rest, as a weighted mean (the module docstring's example);
    weight 1 is `reconstruction_loss` exactly."""
    if foreground_weight == 1.0:
        return reconstruction_loss(decoded, target)
    if decoded.shape != target.shape:
        raise ValueError(f"shapes differ: decoded {tuple(decoded.shape)}, target {tuple(target.shape)}")
    return weighted_mse(decoded, target, foreground_weights(target, foreground_weight))


def foreground_weights(target: torch.Tensor, foreground_weight: float) -> torch.Tensor:
    """float [B, 1, F, H, W]: `foreground_weight` on `foreground_mask(target)`'s pixels, 1 elsewhere."""
    return 1.0 + (foreground_weight - 1.0) * foreground_mask(target.float()).float()


def weighted_mse(decoded: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The MSE of clips [B, C, F, H, W] as a mean weighted per pixel by `weights` [B, 1, F, H, W]
    (shared by every channel)."""
    squared = (decoded.float() - target.float()) ** 2
    return (squared * weights).sum() / (weights.sum() * target.shape[1])


def class_weights(weights: torch.Tensor, truth: torch.Tensor, decoded: torch.Tensor, by_class: dict[int, float], miss: float) -> torch.Tensor:
    """Per-pixel loss weights [B, 1, F, H, W] from a verifier's pixel classes (int [B, 1, F, H, W],
    0 the background): `weights` with each class `c` of `by_class` in the truth, grown by one pixel
    (a 3 x 3 neighbourhood in each frame), weighing `by_class[c]` in place of what it weighed, then
    every pixel whose class differs between `decoded` and `truth` weighing at least `miss`."""
    out = weights
    for cls, weight in sorted(by_class.items()):
        hit = torch.nn.functional.max_pool3d((truth == cls).float(), (1, 3, 3), stride=1, padding=(0, 1, 1)) > 0
        out = torch.where(hit, torch.tensor(float(weight), dtype=out.dtype), out)
    if miss != 1.0:
        out = torch.where(truth != decoded, torch.clamp(out, min=float(miss)), out)
    return out


def psnr_db(mse_signed: float) -> float:
    """PSNR in dB on the [0, 1] range of an MSE measured on [-1, 1] (see the module docstring)."""
    if mse_signed <= 0:
        return math.inf
    return 10.0 * math.log10(4.0 / mse_signed)
