"""How the NFT step's ranks meet: the `comm` object an `NFTTrainer` is given (`Collectives`).

It gives two operations over "the values of every rank this process plays" (`ranks`, in order):
`gather` stacks them across the whole group ([world, ...]) and `mean` averages metric dicts over
the group. A rank of a Ray run plays one rank over a process group (`RankCollectives`); the test
suite's single-process group plays every rank of a group with the same two operations and gives
the same numbers, so fast tests drive the real step.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    """What the step asks of `comm`; `own` holds one value per rank in `ranks`."""

    ranks: tuple[int, ...]
    world_size: int
    device: torch.device

    def gather(self, own: list[torch.Tensor]) -> torch.Tensor: ...

    def mean(self, own: list[dict[str, float]]) -> dict[str, float]: ...


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
