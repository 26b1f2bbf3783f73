"""One Cosmos3 forward for a whole batch of (latents, prompt) samples.

The transformer already accepts several vision items in one packed sequence, but its stock
attention lets every token see every other sample's tokens. Here the batch is laid out as
[text_0 .. text_{B-1} | vision_0 .. vision_{B-1}] and a replacement attention processor applies
block-diagonal masks: text is causal within its own sample, vision sees its own sample's text and
vision. So each sample's output equals a forward of that sample alone.

The masks ride in the `rotary_emb` tuple that the transformer hands to every decoder layer (added
through the model's context-parallel "shard" seam), so they are arguments of the very forward that
uses them: activation checkpointing recomputes a layer with the masks of its own forward.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F
from diffusers import Cosmos3OmniTransformer
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3PackedMoTAttention
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [L, heads, head_dim]; cos/sin: [L, head_dim], shared by every head.
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool):
    # [L, heads, dim] -> SDPA's [1, heads, L, dim]; grouped-query heads are expanded by SDPA.
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        is_causal=causal and mask is None,
        enable_gqa=True,
    )
    return out.squeeze(0).transpose(0, 1).flatten(-2, -1)


class PackedAttnProcessor:
    """Cosmos3's dual-pathway attention with optional per-sample masks.

    `rotary_emb` is (cos_und, sin_und, cos_gen, sin_gen) as the model builds it, optionally followed
    by (und_mask [U, U], gen_mask [G, U + G]) boolean masks (True = may attend). Without masks it
    computes what the stock processor computes for a single sample.
    """

    def __call__(
        self,
        attn: Cosmos3PackedMoTAttention,
        und_seq: torch.Tensor,
        gen_seq: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb[:4]
        und_mask, gen_mask = rotary_emb[4:] if len(rotary_emb) == 6 else (None, None)
        heads, kv_heads, dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim

        q_und = attn.norm_q(attn.to_q(und_seq).view(-1, heads, dim))
        k_und = attn.norm_k(attn.to_k(und_seq).view(-1, kv_heads, dim))
        v_und = attn.to_v(und_seq).view(-1, kv_heads, dim)
        k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
        q_gen = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, dim))
        k_gen = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv_heads, dim))
        v_gen = attn.add_v_proj(gen_seq).view(-1, kv_heads, dim)

        q_und, k_und = _rope(q_und, cos_und, sin_und), _rope(k_und, cos_und, sin_und)
        k_und_for_gen = _rope(k_und_for_gen, cos_und, sin_und)
        q_gen, k_gen = _rope(q_gen, cos_gen, sin_gen), _rope(k_gen, cos_gen, sin_gen)

        und_out = _attend(q_und, k_und, v_und, und_mask, causal=True)
        gen_out = _attend(
            q_gen, torch.cat([k_und_for_gen, k_gen]), torch.cat([v_und, v_gen]), gen_mask, causal=False
        )
        return attn.to_out(und_out), attn.to_add_out(gen_out)


def install_packed_attention(transformer: Cosmos3OmniTransformer) -> None:
    """Give every attention layer a PackedAttnProcessor (idempotent; also fine after LoRA/FSDP)."""
    processor = None
    for module in transformer.modules():
        if isinstance(module, Cosmos3PackedMoTAttention) and not isinstance(module.processor, PackedAttnProcessor):
            processor = processor or PackedAttnProcessor()
            module.set_processor(processor)


class _Layout(NamedTuple):
    """Everything about a packed forward that depends only on prompt lengths and latent size."""

    position_ids: torch.Tensor  # [3, U + G], integer positions (mixed-precision casts leave them alone)
    und_len: int
    tokens_per_image: int
    und_mask: torch.Tensor  # [U, U]
    gen_mask: torch.Tensor  # [G, U + G]


@lru_cache(maxsize=16)
def _layout(
    lengths: tuple[int, ...],
    patch_grid: tuple[int, int],
    modality_margin: int,
    reset_spatial_ids: bool,
    device: torch.device,
) -> _Layout:
    grid_h, grid_w = patch_grid
    tokens_per_image = grid_h * grid_w
    text_positions, vision_positions = [], []
    for length in lengths:
        text, next_offset = get_3d_mrope_ids_text_tokens(length, temporal_offset=0)
        # Images carry no fps modulation (one latent frame), so all positions are integers.
        vision, _ = get_3d_mrope_ids_vae_tokens(
            grid_t=1,
            grid_h=grid_h,
            grid_w=grid_w,
            temporal_offset=next_offset + modality_margin,
            reset_spatial_indices=reset_spatial_ids,
        )
        text_positions.append(text)
        vision_positions.append(vision)
    position_ids = torch.cat(text_positions + vision_positions, dim=1).to(device=device, dtype=torch.long)

    count = len(lengths)
    und_owner = torch.repeat_interleave(torch.arange(count), torch.tensor(lengths))
    gen_owner = torch.arange(count).repeat_interleave(tokens_per_image)
    same_text = und_owner[:, None] == und_owner[None, :]
    # Samples are contiguous, so global causality within a same-sample block is per-sample causality.
    und_mask = same_text & torch.ones_like(same_text).tril()
    gen_mask = gen_owner[:, None] == torch.cat([und_owner, gen_owner])[None, :]
    return _Layout(
        position_ids=position_ids,
        und_len=sum(lengths),
        tokens_per_image=tokens_per_image,
        und_mask=und_mask.to(device),
        gen_mask=gen_mask.to(device),
    )


@contextmanager
def _masks_in_rotary_tuple(transformer: Cosmos3OmniTransformer, layout: _Layout) -> Iterator[None]:
    if transformer._cp_shard_fn is not None:
        raise RuntimeError("packed forwards do not support context parallelism (_cp_shard_fn is already set)")

    def add_masks(und_seq, gen_seq, rotary_emb):
        return und_seq, gen_seq, (*rotary_emb, layout.und_mask, layout.gen_mask)

    transformer._cp_shard_fn = add_masks
    try:
        yield
    finally:
        del transformer._cp_shard_fn  # back to the class default (None)


def _check_inputs(x_t: torch.Tensor, sigma: torch.Tensor, prompt_ids: list[torch.Tensor], channels: int) -> None:
    if x_t.dim() != 4 or x_t.shape[1] != channels:
        raise ValueError(f"x_t must have shape [B, {channels}, h, w], got {tuple(x_t.shape)}")
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


def velocity(
    transformer: Cosmos3OmniTransformer,
    x_t: torch.Tensor,
    sigma: torch.Tensor,
    prompt_ids: list[torch.Tensor],
) -> torch.Tensor:
    """Predicted flow velocity v = noise - x0 for each sample, in one forward.

    x_t: [B, C, h, w] noisy latents; sigma: [B] flow times in [0, 1] (x_t = (1 - s) x0 + s noise);
    prompt_ids: B 1-D LongTensors (lengths may differ), e.g. from `tokenize_prompts`.
    """
    config = transformer.config
    sigma = torch.as_tensor(sigma, device=x_t.device)
    _check_inputs(x_t, sigma, prompt_ids, config.latent_channel)
    install_packed_attention(transformer)

    patch = config.latent_patch_size
    grid = (-(-x_t.shape[2] // patch), -(-x_t.shape[3] // patch))
    layout = _layout(
        tuple(int(ids.numel()) for ids in prompt_ids),
        grid,
        int(config.unified_3d_mrope_temporal_modality_margin),
        bool(config.unified_3d_mrope_reset_spatial_ids),
        x_t.device,
    )
    batch = x_t.shape[0]
    vision_len = batch * layout.tokens_per_image
    vision_indexes = torch.arange(layout.und_len, layout.und_len + vision_len, device=x_t.device)
    input_ids = torch.cat([ids.to(x_t.device) for ids in prompt_ids])
    # The model multiplies timesteps by `timestep_scale`, so it sees exactly sigma.
    timesteps = (sigma.float() / config.timestep_scale).repeat_interleave(layout.tokens_per_image)
    one_frame = torch.zeros(1, dtype=torch.long, device=x_t.device)

    with _masks_in_rotary_tuple(transformer, layout):
        predictions = transformer(
            input_ids=input_ids,
            text_indexes=torch.arange(layout.und_len, device=x_t.device),
            position_ids=layout.position_ids,
            und_len=layout.und_len,
            sequence_length=layout.und_len + vision_len,
            vision_tokens=[sample[None, :, None] for sample in x_t],  # [1, C, T=1, h, w] each
            vision_token_shapes=[(1, *grid)] * batch,
            vision_sequence_indexes=vision_indexes,
            vision_mse_loss_indexes=vision_indexes,
            vision_timesteps=timesteps,
            vision_noisy_frame_indexes=[one_frame] * batch,
            return_dict=False,
        )[0]
    return torch.cat(predictions)[:, :, 0].to(x_t.dtype)
