"""How the NFT step's ranks meet: a real process group, or every rank in one process.

Both give the same two operations over "the values of every rank this process plays":
`gather` stacks them across the whole group ([world, ...]) and `mean` averages metric dicts over
the group. A rank of a Ray run plays one rank (`RankCollectives`); the test-only single-process
group plays all of them (`LocalCollectives`).
"""

from __future__ import annotations

import torch


class RankCollectives:
    """This process is rank `rank` of a torch.distributed world of `world_size`."""

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.ranks = (rank,)
        self.world_size = world_size
        self.device = device

    def gather(self, own: list[torch.Tensor]) -> torch.Tensor:
        import torch.distributed as dist

        (tensor,) = own
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def mean(self, own: list[dict[str, float]]) -> dict[str, float]:
        import torch.distributed as dist

        (values,) = own
        keys = sorted(values)
        vec = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec)
        vec /= self.world_size
        return dict(zip(keys, vec.tolist()))


class LocalCollectives:
    """This process plays every rank 0..world_size-1 of the group (no process group)."""

    def __init__(self, world_size: int, device: torch.device):
        self.ranks = tuple(range(world_size))
        self.world_size = world_size
        self.device = device

    def gather(self, own: list[torch.Tensor]) -> torch.Tensor:
        assert len(own) == self.world_size, "one value per played rank"
        return torch.stack([t.contiguous() for t in own])

    def mean(self, own: list[dict[str, float]]) -> dict[str, float]:
        assert len(own) == self.world_size, "one metrics dict per played rank"
        keys = sorted(own[0])
        vec = torch.tensor([[float(values[k]) for k in keys] for values in own], dtype=torch.float64).sum(0)
        vec /= self.world_size
        return dict(zip(keys, vec.tolist()))
