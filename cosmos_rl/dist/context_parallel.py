"""Ulysses-style context parallelism: the collectives that let `size` ranks share one long sequence.

Each rank of a context-parallel group holds a contiguous 1/size slice of the vision (generation)
tokens through every per-token layer (norms, MLPs, projections). Attention needs every token, so
around it an all-to-all trades the sequence split for a head split (`sequence_to_heads`: each rank
then holds all tokens for heads/size of the heads) and the inverse all-to-all trades it back
(`heads_to_sequence`). `gather_sequence` puts the full sequence back together after the last layer.
The model side (which tensors go through these, the text tokens, grouped KV heads) is
`models/packed_attention.py` and `models/packing.py`.

Gradient convention ("mean over the group"): every rank of a group runs the same batch and computes
the same loss from the same gathered output, and the gradient of a parameter is the MEAN over the
group of each rank's gradient. Work done identically on every rank (the text tower, the embedding
before the split, the output head after the gather) then contributes its full gradient on every
rank, and work on a rank's own slice contributes `size` times its share (`gather_sequence`'s
backward scales by `size`), so the mean is the one-rank gradient. FSDP2 over a (data x context)
mesh averages over all its ranks, which is exactly this mean within a context group.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist


class ContextParallel(NamedTuple):
    """A context-parallel group as the forward carries it: the process `group`, this process's
    `rank` in it and its `size`. Rides in the rotary tuple of every decoder layer (models/packing),
    so activation checkpointing recomputes a layer with the group of its own forward."""

    group: object  # torch.distributed.ProcessGroup
    rank: int
    size: int


def context_parallel_group(group=None) -> ContextParallel:
    """The `ContextParallel` of `group` (None: the default process group) for this process."""
    if not dist.is_initialized():
        raise RuntimeError("context parallelism needs an initialised torch.distributed process group")
    return ContextParallel(group, dist.get_rank(group), dist.get_world_size(group))


class DataContextLayout(NamedTuple):
    """The world as (data parallel) x (context parallel): `dp_size` groups of `cp.size` consecutive
    ranks; every rank of a context group trains the same samples, those of data-parallel rank
    `dp_rank`. `mesh` is the 2-D device mesh ("dp", "cp")."""

    dp_rank: int
    dp_size: int
    cp: ContextParallel
    mesh: object  # torch.distributed.device_mesh.DeviceMesh


def data_context_layout(context: int, device_type: str = "cpu") -> DataContextLayout:
    """Split the default process group into data-parallel x context-parallel (`context` ranks per
    group, consecutive ranks together, so a group stays inside a node when it fits one).

    FSDP2 over the whole world (`dist.fsdp.shard_transformer` without a mesh) then averages every
    gradient over dp x cp ranks: the mean over each context group (this module's convention) and
    the mean over the data-parallel ranks' samples, as without context parallelism."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise RuntimeError("context parallelism needs an initialised torch.distributed process group")
    world = dist.get_world_size()
    if context < 1 or world % context:
        raise ValueError(f"grid.context_parallel = {context} does not divide the {world} ranks; use a divisor of {world}")
    mesh = init_device_mesh(device_type, (world // context, context), mesh_dim_names=("dp", "cp"))
    cp = ContextParallel(mesh.get_group("cp"), mesh.get_local_rank("cp"), context)
    return DataContextLayout(mesh.get_local_rank("dp"), world // context, cp, mesh)


def _all_to_all(blocks: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    # blocks: [size, ...]; block j goes to rank j, block i of the result came from rank i.
    blocks = blocks.contiguous()
    out = torch.empty_like(blocks)
    dist.all_to_all_single(out, blocks, group=cp.group)
    return out


def _to_heads(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    # [L/size, H, d] (my tokens, every head) -> [L, H/size, d] (every token, my heads).
    local, heads, dim = x.shape
    blocks = x.view(local, cp.size, heads // cp.size, dim).transpose(0, 1)  # block j: heads of rank j
    return _all_to_all(blocks, cp).view(cp.size * local, heads // cp.size, dim)  # rank i's tokens in order


def _to_sequence(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    # [L, H/size, d] (every token, my heads) -> [L/size, H, d] (my tokens, every head).
    total, heads, dim = x.shape
    blocks = x.view(cp.size, total // cp.size, heads, dim)  # block j: the tokens of rank j
    received = _all_to_all(blocks, cp)  # block i: my tokens, the heads of rank i
    return received.transpose(0, 1).reshape(total // cp.size, cp.size * heads, dim)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
        ctx.cp = cp
        return _to_heads(x, cp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # An all-to-all is a permutation of the group's data: its adjoint is the inverse one.
        return _to_sequence(grad, ctx.cp), None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
        ctx.cp = cp
        return _to_sequence(x, cp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _to_heads(grad, ctx.cp), None


def sequence_to_heads(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """[L/size, H, d] this rank's tokens with every head -> [L, H/size, d] every rank's tokens (in
    rank order) with this rank's heads (rank r: heads r*H/size .. (r+1)*H/size - 1). H must divide."""
    if x.dim() != 3 or x.shape[1] % cp.size:
        raise ValueError(f"sequence_to_heads needs [tokens, heads, dim] with heads divisible by {cp.size}, got {tuple(x.shape)}")
    return _SequenceToHeads.apply(x, cp)


def heads_to_sequence(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """The inverse of `sequence_to_heads`: [L, H/size, d] -> [L/size, H, d]."""
    if x.dim() != 3 or x.shape[0] % cp.size:
        raise ValueError(f"heads_to_sequence needs [tokens, heads, dim] with tokens divisible by {cp.size}, got {tuple(x.shape)}")
    return _HeadsToSequence.apply(x, cp)


def check_same_input(cp: ContextParallel, fingerprint: torch.Tensor, what: str) -> None:
    """Raise on every rank of the group unless every rank passed the same `fingerprint` (a few
    float64 numbers of its input, on the group's device: sizes and sums). The group's collectives
    assume one shared input: different sizes would hang an all-to-all and different values would
    mix samples silently. One small all-gather, so every rank sees every fingerprint and all raise
    together."""
    mine = fingerprint.detach().to(torch.float64).contiguous()
    everyone = [torch.empty_like(mine) for _ in range(cp.size)]
    dist.all_gather(everyone, mine, group=cp.group)
    differing = [rank for rank, theirs in enumerate(everyone) if not torch.equal(theirs, everyone[0])]
    if differing:
        raise ValueError(
            f"context-parallel ranks {differing} got another {what} than rank 0 of their group: every rank of a "
            "context group must run the same samples (feed them by data-parallel rank, dist.context_parallel.data_context_layout)"
        )


def local_slice(x: torch.Tensor, cp: ContextParallel, dim: int = 0) -> torch.Tensor:
    """This rank's contiguous 1/size of `x` (the same on every rank) along `dim`; a plain slice, so
    the backward hands the rest of `x` a zero gradient (the other ranks account for it)."""
    if x.shape[dim] % cp.size:
        raise ValueError(f"{x.shape[dim]} tokens do not split over {cp.size} context-parallel ranks")
    return x.chunk(cp.size, dim=dim)[cp.rank]


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
        ctx.cp = cp
        parts = [torch.empty_like(x) for _ in range(cp.size)]
        dist.all_gather(parts, x.contiguous(), group=cp.group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank computed the same loss from the same gathered tensor, so `grad` is the same on
        # every rank; this rank's slice, times size for the group mean (module docstring).
        cp = ctx.cp
        return grad.chunk(cp.size)[cp.rank] * cp.size, None


def gather_sequence(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """Every rank's [L/size, ...] slice -> the whole [L, ...] on every rank, in rank order."""
    return _GatherSequence.apply(x, cp)
