"""One Cosmos3 forward for a whole batch of (latents, prompt) samples.

The transformer already accepts several vision items in one packed sequence, but its stock
attention lets every token see every other sample's tokens. Here the batch is laid out as
[text_0 .. text_{B-1} | vision_0 .. vision_{B-1}], with samples of equal prompt length adjacent,
and a replacement attention processor attends each sample on its own: text is causal within its
own sample, vision sees its own sample's text and vision. Samples with equal text lengths form one
segment whose attention is a single batched SDPA call ([n, heads, L, dim], no mask, so fused
kernels apply), so attention costs sum(L_i^2), not (sum L_i)^2, and each sample's output equals
a forward of that sample alone.

The segment description rides in the `rotary_emb` tuple that the transformer hands to every
decoder layer (added through the model's context-parallel "shard" seam), so it is an argument of
the very forward that uses it: activation checkpointing recomputes a layer with the segments of
its own forward.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Iterator, NamedTuple, Sequence

import torch
from diffusers import Cosmos3OmniTransformer
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)

from cosmos_rl.core.flow import model_timesteps
from cosmos_rl.dist.context_parallel import ContextParallel, check_same_input, gather_sequence, local_slice
from cosmos_rl.models import text_kv
from cosmos_rl.models.packed_attention import Segments, install_packed_attention

if TYPE_CHECKING:
    from cosmos_rl.models.actions import ActionLayout


class _Layout(NamedTuple):
    """Everything about a packed forward that depends only on prompt lengths and the latent grid."""

    # [3, U + G] mRoPE positions, as the pipeline builds them: float32 when the model modulates
    # time by fps (`enable_fps_modulation`; text positions are then float even for one frame),
    # else integers. The rotary embedding reads both as float32, so equal values give equal
    # outputs; the sharded root takes its inputs uncast (dist.fsdp), so they arrive as built.
    position_ids: torch.Tensor
    und_len: int
    segments: Segments


class _Timing(NamedTuple):
    """The pipeline's fps modulation of vision time positions: `fps` of the clip, `base_fps` of the
    model, the VAE's temporal compression; `fps` None = no modulation (integer steps)."""

    float_positions: bool
    fps: float | None
    base_fps: float
    temporal_factor: int


@lru_cache(maxsize=16)
def _layout(
    lengths: tuple[int, ...],
    grid: tuple[int, int, int],
    modality_margin: int,
    reset_spatial_ids: bool,
    timing: _Timing,
    device: torch.device,
    action_rows: int = 0,
) -> _Layout:
    grid_t, grid_h, grid_w = grid
    tokens_per_sample = grid_t * grid_h * grid_w + action_rows
    text_positions, vision_positions = [], []
    for length in lengths:
        # What Cosmos3OmniPipeline._prepare_text_segment / _prepare_vision_segment build per prompt.
        text, next_offset = get_3d_mrope_ids_text_tokens(
            length, temporal_offset=0, use_float_positions=timing.float_positions
        )
        vision, _ = get_3d_mrope_ids_vae_tokens(
            grid_t=grid_t,
            grid_h=grid_h,
            grid_w=grid_w,
            temporal_offset=next_offset + modality_margin,
            reset_spatial_indices=reset_spatial_ids,
            fps=timing.fps,  # one latent frame: no modulation whatever it says
            base_fps=timing.base_fps,
            temporal_compression_factor=timing.temporal_factor,
        )
        text_positions.append(text)
        vision_positions.append(vision)
        if action_rows:
            # _prepare_action_segment: the rows share the vision offset; row i sits at pixel frame
            # i + 1 (one frame per latent step of compression 1, on the VAE's time base).
            actions, _ = get_3d_mrope_ids_vae_tokens(
                grid_t=action_rows,
                grid_h=1,
                grid_w=1,
                temporal_offset=next_offset + modality_margin,
                reset_spatial_indices=reset_spatial_ids,
                fps=timing.fps,
                base_fps=timing.base_fps,
                temporal_compression_factor=1,
                base_temporal_compression_factor=timing.temporal_factor,
                start_frame_offset=1,
            )
            vision_positions.append(actions)  # a sample's generation block: its vision, then its actions
    position_ids = torch.cat(text_positions + vision_positions, dim=1).to(device=device)

    groups: list[list[int]] = []  # runs of adjacent samples with equal text length
    for length in lengths:
        if groups and groups[-1][1] == length:
            groups[-1][0] += 1
        else:
            groups.append([1, length])
    return _Layout(
        position_ids=position_ids,
        und_len=sum(lengths),
        segments=Segments(tuple((count, length) for count, length in groups), tokens_per_sample),
    )


_CONTEXT_PARALLEL = "_cosmos_rl_context_parallel"


def set_context_parallel(transformer: Cosmos3OmniTransformer, cp: "ContextParallel | None") -> None:
    """Run every later packed forward of `transformer` context parallel over `cp`
    (`dist.context_parallel.context_parallel_group`), or not (None).

    Every rank of the group must call `velocity` with the same batch; each returns the whole
    velocity. The vision tokens (with any action rows) of the batch are split into `cp.size`
    contiguous slices, one per rank, so their count must divide by it (per sample, preflight checks
    `grid.context_parallel`); the text tokens are replicated on every rank. Parameter gradients are
    the group MEAN of the ranks' gradients (`dist.context_parallel`), which FSDP2 over a (data x
    context) mesh computes."""
    if cp is None:
        if hasattr(transformer, _CONTEXT_PARALLEL):
            delattr(transformer, _CONTEXT_PARALLEL)
        return
    config = transformer.config
    heads = int(config.num_attention_heads)
    if heads % cp.size:
        raise ValueError(
            f"{heads} attention heads do not split over {cp.size} context-parallel ranks; "
            "set grid.context_parallel to a divisor of the head count"
        )
    setattr(transformer, _CONTEXT_PARALLEL, cp if cp.size > 1 else None)


def context_parallel_of(transformer: Cosmos3OmniTransformer) -> "ContextParallel | None":
    """The group `set_context_parallel` gave `transformer` (None: every forward is whole)."""
    return getattr(transformer, _CONTEXT_PARALLEL, None)


@contextmanager
def _segments_in_rotary_tuple(
    transformer: Cosmos3OmniTransformer, layout: _Layout, plan: "text_kv.TextKVPlan | None" = None
) -> Iterator[None]:
    if transformer._cp_shard_fn is not None:
        raise RuntimeError("packed forwards bring their own context parallelism (_cp_shard_fn is already set)")
    reuse = plan is not None and plan.reuse
    cp = context_parallel_of(transformer)
    extra = (layout.segments,) if plan is None and cp is None else (layout.segments, plan, cp)

    def add_segments(und_seq, gen_seq, rotary_emb):
        # Reusing held text keys/values: the text stream enters the layers empty (zero rows).
        if cp is not None:
            # First, before any rank can raise alone: token counts and sums of the hidden states
            # entering the layers, bitwise equal across the group when its ranks run one batch.
            sizes = torch.tensor([und_seq.shape[0], gen_seq.shape[0]], dtype=torch.float64, device=gen_seq.device)
            sums = torch.stack([und_seq.detach().double().sum(), gen_seq.detach().double().sum()])
            check_same_input(cp, torch.cat([sizes, sums]), "batch")
            if gen_seq.shape[0] % cp.size:
                raise ValueError(
                    f"{gen_seq.shape[0]} vision/action tokens of this batch do not split over grid.context_parallel = "
                    f"{cp.size} ranks; choose a size, frame count or patch grid whose token count per sample divides by it"
                )
            # This rank's contiguous slice of the vision tokens and of their rotary tables.
            cos_und, sin_und, cos_gen, sin_gen = rotary_emb
            gen_seq = local_slice(gen_seq, cp)
            rotary_emb = (cos_und, sin_und, local_slice(cos_gen, cp), local_slice(sin_gen, cp))
        return (und_seq[:0] if reuse else und_seq), gen_seq, (*rotary_emb, *extra)

    def rows_back(und_out, gen_out):
        # The final hidden state is indexed as [text | vision]; only vision rows are read (text rows
        # are zeros when the text stream did not run, and are read by no output head otherwise).
        if reuse:
            und_out = und_out.new_zeros(layout.und_len, und_out.shape[-1])
        if cp is not None:
            gen_out = gather_sequence(gen_out, cp)
        return und_out, gen_out

    transformer._cp_shard_fn = add_segments
    if reuse or cp is not None:
        transformer._cp_gather_fn = rows_back
    try:
        yield
    finally:
        del transformer._cp_shard_fn  # back to the class default (None)
        if reuse or cp is not None:
            del transformer._cp_gather_fn


def timesteps_per_unit(config) -> int:
    """N with timestep_scale = 1 / N: the pipeline's integer timesteps per unit of flow time."""
    steps = round(1.0 / config.timestep_scale)
    if abs(steps * config.timestep_scale - 1.0) > 1e-9:
        raise ValueError(
            f"timestep_scale {config.timestep_scale} is not 1 / an integer; the pipeline's integer "
            "timesteps would not map onto flow time"
        )
    return steps


def _check_inputs(x_t: torch.Tensor, sigma: torch.Tensor, prompt_ids: list[torch.Tensor], channels: int) -> None:
    if x_t.dim() != 5 or x_t.shape[1] != channels:
        raise ValueError(f"x_t must have shape [B, {channels}, T, h, w], got {tuple(x_t.shape)}")
    batch = x_t.shape[0]
    if sigma.shape != (batch,):
        raise ValueError(f"sigma must have shape [{batch}], got {tuple(sigma.shape)}")
    if len(prompt_ids) != batch:
        raise ValueError(f"got {len(prompt_ids)} prompts for {batch} latents")
    for index, ids in enumerate(prompt_ids):
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype != torch.long:
            raise ValueError(
                f"prompt_ids[{index}] must be a non-empty 1-D LongTensor, got {ids.dtype} {tuple(ids.shape)}"
            )


def _timing(config, fps: float | None, temporal_factor: int | None) -> _Timing:
    if (fps is None) != (temporal_factor is None):
        raise ValueError(f"give fps and temporal_factor together (got fps {fps}, temporal_factor {temporal_factor})")
    modulated = bool(config.enable_fps_modulation)
    return _Timing(
        float_positions=modulated,
        fps=float(fps) if modulated and fps is not None else None,
        base_fps=float(config.base_fps),
        temporal_factor=int(temporal_factor) if temporal_factor is not None else 1,
    )


def packed_inputs(
    config,
    x_t: torch.Tensor,
    sigma: torch.Tensor,
    prompt_ids: list[torch.Tensor],
    *,
    fps: float | None = None,
    temporal_factor: int | None = None,
    clean_frames: int | Sequence[int] = 0,
    actions: torch.Tensor | None = None,
    action_layout: "ActionLayout | None" = None,
) -> tuple[dict, _Layout]:
    """The transformer's keyword arguments for the samples in the order given, and their layout.

    Every sample is laid out as `Cosmos3OmniPipeline._prepare_text_segment` and
    `_prepare_vision_segment` lay out one prompt and its latents [1, C, T, h, w]: a (t, h, w) patch
    grid, positions modulated by `fps` (see `velocity`). The first `clean_frames` latent frames (one
    count for the batch, or one per sample) are clean conditions (the pipeline's image-to-video
    frame 0, or its video-to-video frames): no timestep embedding and no prediction; every later
    frame is noisy and predicted. `actions` [B, rows, action_dim] with their `action_layout`
    (`models.actions`) follow each sample's vision tokens as `_prepare_action_segment` lays them out;
    a sample whose every frame is clean must then generate action rows (inverse dynamics).
    """
    patch = config.latent_patch_size
    grid = (int(x_t.shape[2]), -(-x_t.shape[3] // patch), -(-x_t.shape[4] // patch))
    batch = x_t.shape[0]
    if (actions is None) != (action_layout is None):
        raise ValueError("give action rows and their action_layout together")
    if action_layout is not None:
        if action_layout.batch != batch:
            raise ValueError(f"action layout has {action_layout.batch} samples, the latents {batch}")
        action_layout.check(config, actions)
    action_rows = action_layout.rows if action_layout is not None else 0
    layout = _layout(
        tuple(int(ids.numel()) for ids in prompt_ids),
        grid,
        int(config.unified_3d_mrope_temporal_modality_margin),
        bool(config.unified_3d_mrope_reset_spatial_ids),
        _timing(config, fps, temporal_factor),
        x_t.device,
        action_rows=action_rows,
    )
    per_sample = layout.segments.tokens_per_sample  # a sample's generation block: vision, then actions
    vision_tokens = per_sample - action_rows
    gen_len = batch * per_sample
    block_starts = layout.und_len + per_sample * torch.arange(batch, device=x_t.device)
    if action_rows:
        vision_indexes = (block_starts[:, None] + torch.arange(vision_tokens, device=x_t.device)).flatten()
    else:
        vision_indexes = torch.arange(layout.und_len, layout.und_len + gen_len, device=x_t.device)
    clean = [int(clean_frames)] * batch if isinstance(clean_frames, int) else [int(k) for k in clean_frames]
    # Every sample needs something to predict: a noisy latent frame, or (with actions) a noisy row.
    generates_rows = [clean_rows < action_rows for clean_rows in action_layout.clean_rows] if action_rows else [False] * batch
    if len(clean) != batch or not all(0 <= k < grid[0] or (k == grid[0] and rows) for k, rows in zip(clean, generates_rows)):
        raise ValueError(f"clean_frames must leave each of {batch} samples a noisy latent frame of {grid[0]}: {clean_frames}")
    frame_tokens = grid[1] * grid[2]  # frames are the grid's slowest axis
    noisy_frames = [torch.arange(k, grid[0], device=x_t.device) for k in clean]
    predicted = vision_indexes
    if any(clean):
        per_sample_indexes = vision_indexes.view(batch, vision_tokens)
        predicted = torch.cat([per_sample_indexes[b, k * frame_tokens :] for b, k in enumerate(clean)])
    # Integer timesteps, as the stock pipeline passes them (the model multiplies by timestep_scale),
    # one per noisy token. Integers also pass FSDP2's mixed-precision input cast untouched.
    noisy_tokens = torch.tensor([vision_tokens - k * frame_tokens for k in clean], device=x_t.device)
    sample_timesteps = model_timesteps(sigma, timesteps_per_unit(config))
    if not any(clean):
        timesteps = sample_timesteps.repeat_interleave(vision_tokens)
    else:
        timesteps = sample_timesteps.repeat_interleave(noisy_tokens)
    inputs = dict(
        input_ids=torch.cat([ids.to(x_t.device) for ids in prompt_ids]),
        text_indexes=torch.arange(layout.und_len, device=x_t.device),
        position_ids=layout.position_ids,
        und_len=layout.und_len,
        sequence_length=layout.und_len + gen_len,
        vision_tokens=[sample[None] for sample in x_t],  # [1, C, T, h, w] each
        vision_token_shapes=[grid] * batch,
        vision_sequence_indexes=vision_indexes,
        vision_mse_loss_indexes=predicted,
        vision_timesteps=timesteps,
        vision_noisy_frame_indexes=noisy_frames,
    )
    if action_rows:
        from cosmos_rl.models.actions import action_inputs

        inputs.update(action_inputs(actions, action_layout, block_starts + vision_tokens, sample_timesteps))
    return inputs, layout


def velocity(
    transformer: Cosmos3OmniTransformer,
    x_t: torch.Tensor,
    sigma: torch.Tensor,
    prompt_ids: list[torch.Tensor],
    *,
    fps: float | None = None,
    temporal_factor: int | None = None,
    clean_frames: int | Sequence[int] = 0,
    actions: torch.Tensor | None = None,
    action_layout: "ActionLayout | None" = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Predicted flow velocity v = noise - x0 for each sample, in one forward.

    x_t: [B, C, T, h, w] noisy latents (T = 1 for images); sigma: [B] flow times in [0, 1]
    (x_t = (1 - s) x0 + s noise); prompt_ids: B 1-D LongTensors (lengths may differ), e.g. from
    `tokenize_prompts`. The model sees the time `flow.model_timesteps(sigma)` * timestep_scale,
    exactly as the stock pipeline feeds it. `fps` (the clip's frame rate) and `temporal_factor`
    (the VAE's temporal compression, the pipeline's `vae_scale_factor_temporal`), given together,
    space latent frames in time as the pipeline does when the model has `enable_fps_modulation`:
    frame k at k * base_fps / fps; None = one step per frame, and a single frame is never modulated.
    `clean_frames`: leading latent frames that are clean conditions (image-to-video: 1), for the
    batch or per sample; their velocity is exactly 0, as the model leaves unpredicted frames. Returns [B, C, T, h, w].
    `actions` [B, rows, action_dim] (noisy and clean rows, `models.actions`) with their
    `action_layout`: each sample's action rows join its forward, and the return is then
    (v [B, C, T, h, w], action velocity [B, rows, action_dim], 0 at clean rows and padding columns).
    """
    config = transformer.config
    sigma = torch.as_tensor(sigma, device=x_t.device)
    _check_inputs(x_t, sigma, prompt_ids, config.latent_channel)
    install_packed_attention(transformer)

    # Pack samples with equal prompt lengths next to each other (a stable sort), so each length is
    # one batched attention call; the predictions are put back in the caller's order at the end.
    lengths = [int(ids.numel()) for ids in prompt_ids]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    reordered = order != list(range(len(lengths)))
    caller_layout = action_layout
    if reordered:
        x_t, sigma, prompt_ids = x_t[order], sigma[order], [prompt_ids[index] for index in order]
        if not isinstance(clean_frames, int):
            clean_frames = [clean_frames[index] for index in order]
        if actions is not None:
            actions = actions[order]
        if action_layout is not None:
            action_layout = action_layout.take(order)
    inputs, layout = packed_inputs(
        config, x_t, sigma, prompt_ids, fps=fps, temporal_factor=temporal_factor, clean_frames=clean_frames,
        actions=actions, action_layout=action_layout,
    )  # fmt: skip
    plan = text_kv.plan_for(transformer, prompt_ids)
    with _segments_in_rotary_tuple(transformer, layout, plan):
        predictions, _, action_predictions = transformer(**inputs, return_dict=False)
    text_kv.finish(plan)
    if reordered:
        predictions = _restored(predictions, order)
        if action_predictions is not None:
            action_predictions = _restored(action_predictions, order)
    if actions is None:
        return torch.cat(predictions).to(x_t.dtype)
    from cosmos_rl.models.actions import action_velocity

    return torch.cat(predictions).to(x_t.dtype), action_velocity(action_predictions, caller_layout).to(actions.dtype)


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, index in enumerate(order):
        inverse[index] = position
    return inverse


def _restored(values: list, order: list[int]) -> list:
    # Packed position p holds sample order[p]: put each back at its caller's index.
    return [values[position] for position in _inverse(order)]
