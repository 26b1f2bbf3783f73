"""Per-sample attention inside one packed Cosmos3 forward (`models/packing.py` lays the batch out):
`PackedAttnProcessor` replaces the stock processor so each sample's text attends causally to its
own text and its vision tokens to its own text and vision, with the rotary tables the model built
and, when a `text_kv` plan reuses them, the text tower's held keys and values."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from diffusers import Cosmos3OmniTransformer
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3PackedMoTAttention

from cosmos_rl.dist.context_parallel import ContextParallel, heads_to_sequence, sequence_to_heads
from cosmos_rl.models import text_kv


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [L, heads, head_dim]; cos/sin: [L, head_dim], shared by every head.
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


class Segments(NamedTuple):
    """How the packed sequence splits into samples: `groups` is ((count, text_len), ...) in packed
    order, each a run of `count` adjacent samples whose prompts have `text_len` tokens; every
    sample has `tokens_per_sample` vision tokens. Plain ints, so mixed-precision casts and
    checkpoint recompute carry it unchanged."""

    groups: tuple[tuple[int, int], ...]
    tokens_per_sample: int


def _run(x: torch.Tensor, start: int, count: int, tokens: int) -> torch.Tensor:
    # `count` adjacent samples of `tokens` tokens each from a packed [L, heads, dim]: a
    # [count, tokens, heads, dim] view.
    return x[start : start + count * tokens].unflatten(0, (count, tokens))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    # [n, L, heads, dim] -> SDPA's [n, heads, L, dim] -> [n * L, heads * dim]; grouped-query
    # heads are expanded by SDPA.
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True
    )
    return out.transpose(1, 2).flatten(0, 1).flatten(-2, -1)


class PackedAttnProcessor:
    """Cosmos3's dual-pathway attention, optionally per sample.

    `rotary_emb` is (cos_und, sin_und, cos_gen, sin_gen) as the model builds it, optionally followed
    by a `Segments`, a `text_kv.TextKVPlan` (or None) and a `ContextParallel` (or None). Without them
    it computes what the stock processor computes for a single sample. A reusing plan brings the
    text keys/values (the text stream then arrives empty and the text outputs are empty); a
    recording plan keeps the ones computed here.

    Context parallel (Ulysses): `gen_seq` and cos_gen/sin_gen are this rank's contiguous slice of
    the vision tokens. Its queries/keys/values go through an all-to-all to every vision token for
    heads/size of the heads, attend, and come back. The text tokens are replicated: every rank
    holds them all and computes the text tower's causal attention whole (it reads no vision token),
    and its vision attention reads the text keys/values of its own heads. KV heads that do not
    divide by the group size are repeated up to one per query head first (more all-to-all bytes).
    """

    def __call__(
        self,
        attn: Cosmos3PackedMoTAttention,
        und_seq: torch.Tensor,
        gen_seq: torch.Tensor,
        rotary_emb: tuple,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb[:4]
        if len(rotary_emb) >= 5:
            groups, per_sample = rotary_emb[4]
        else:  # one sample: all text, then all vision
            groups, per_sample = ((1, und_seq.shape[0]),), gen_seq.shape[0]
        plan = rotary_emb[5] if len(rotary_emb) >= 6 else None
        cp: ContextParallel | None = rotary_emb[6] if len(rotary_emb) >= 7 else None
        heads, kv_heads, dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim

        q_gen = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, dim))
        k_gen = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv_heads, dim))
        v_gen = attn.add_v_proj(gen_seq).view(-1, kv_heads, dim)
        q_gen, k_gen = _rope(q_gen, cos_gen, sin_gen), _rope(k_gen, cos_gen, sin_gen)
        if plan is not None and plan.reuse:
            k_und_for_gen, v_und = plan.keys_values(attn)
            q_und = k_und = None
        else:
            q_und = attn.norm_q(attn.to_q(und_seq).view(-1, heads, dim))
            k_und = attn.norm_k(attn.to_k(und_seq).view(-1, kv_heads, dim))
            v_und = attn.to_v(und_seq).view(-1, kv_heads, dim)
            k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
            q_und, k_und = _rope(q_und, cos_und, sin_und), _rope(k_und, cos_und, sin_und)
            k_und_for_gen = _rope(k_und_for_gen, cos_und, sin_und)
            if plan is not None:
                plan.keep(attn, k_und_for_gen, v_und)

        local_tokens = gen_seq.shape[0]
        if cp is not None:
            q_gen, k_gen, v_gen, k_und_for_gen, v_und_for_gen = _heads_of_rank(
                q_gen, k_gen, v_gen, k_und_for_gen, v_und, heads, kv_heads, cp
            )
        else:
            v_und_for_gen = v_und

        und_outs, gen_outs = [], []
        text_at = vision_at = 0
        for count, length in groups:
            text = partial(_run, start=text_at, count=count, tokens=length)
            vision = partial(_run, start=vision_at, count=count, tokens=per_sample)
            if q_und is not None:
                und_outs.append(_attend(text(q_und), text(k_und), text(v_und), causal=True))
            keys = torch.cat([text(k_und_for_gen), vision(k_gen)], dim=1)
            values = torch.cat([text(v_und_for_gen), vision(v_gen)], dim=1)
            gen_outs.append(_attend(vision(q_gen), keys, values, causal=False))
            text_at, vision_at = text_at + count * length, vision_at + count * per_sample
        if (text_at, vision_at) != (v_und.shape[0], q_gen.shape[0]):
            raise RuntimeError(
                f"segments cover {text_at} text / {vision_at} vision tokens, the forward has "
                f"{v_und.shape[0]} / {q_gen.shape[0]}"
            )
        gen_out = gen_outs[0] if len(gen_outs) == 1 else torch.cat(gen_outs)
        if cp is not None:  # [L, my heads * dim] -> this rank's tokens, every head
            gen_out = heads_to_sequence(gen_out.view(q_gen.shape[0], -1, dim), cp).reshape(local_tokens, heads * dim)
        if q_und is None:  # reuse: no text stream runs through this forward
            return und_seq, attn.to_add_out(gen_out)
        und_out = und_outs[0] if len(und_outs) == 1 else torch.cat(und_outs)
        return attn.to_out(und_out), attn.to_add_out(gen_out)


def _heads_of_rank(q_gen, k_gen, v_gen, k_text, v_text, heads: int, kv_heads: int, cp: ContextParallel):
    """This rank's slice of the vision tokens with every head -> every vision token with this rank's
    heads, and the (replicated) text keys/values of those heads."""
    if heads % cp.size:
        raise ValueError(
            f"{heads} attention heads do not split over grid.context_parallel = {cp.size} ranks; "
            "set grid.context_parallel to a divisor of the head count"
        )
    if kv_heads % cp.size:
        # Query head i reads KV head i // (heads / kv_heads): repeating each KV head that many
        # times gives one KV head per query head, which splits like the query heads.
        repeat = heads // kv_heads
        k_gen, v_gen, k_text, v_text = (x.repeat_interleave(repeat, dim=1) for x in (k_gen, v_gen, k_text, v_text))
        kv_heads = heads
    mine = slice(cp.rank * kv_heads // cp.size, (cp.rank + 1) * kv_heads // cp.size)
    return (
        sequence_to_heads(q_gen, cp),
        sequence_to_heads(k_gen, cp),
        sequence_to_heads(v_gen, cp),
        k_text[:, mine],
        v_text[:, mine],
    )


def install_packed_attention(transformer: Cosmos3OmniTransformer) -> None:
    """Give every attention layer a PackedAttnProcessor (idempotent; also fine after LoRA/FSDP)."""
    processor = None
    for module in transformer.modules():
        if isinstance(module, Cosmos3PackedMoTAttention) and not isinstance(module.processor, PackedAttnProcessor):
            processor = processor or PackedAttnProcessor()
            module.set_processor(processor)
