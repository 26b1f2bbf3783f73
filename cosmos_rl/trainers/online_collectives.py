"""How the NFT step's ranks meet: the `comm` object an `NFTTrainer` is given (`Collectives`).

It gives two operations over "the values of every rank this process plays" (`ranks`, in order):
`gather` stacks them across the whole group ([world, ...]) and `mean` averages metric dicts over
the group. A rank of a Ray run plays one rank over a process group (`RankCollectives`); the test
suite's single-process group plays every rank of a group with the same two operations and gives
the same numbers, so fast tests drive the real step.

Context parallelism (`grid.context_parallel` = N > 1, docs/long_clips.md): the world is G x N
ranks, consecutive N of them one context group (`dist.context_parallel.data_context_layout`) that
shares one sample of the group. The step's "ranks" are then the data-parallel ranks: `ranks` is
this process's data-parallel rank, `world_size` the G of them, `gather` keeps one value per context
group (its first rank's) and `mean` averages over data-parallel ranks. `cp` is the context group
(None: off), and `scores` says whether this process calls the reward services (a context group's
first rank only, so every sample is scored once).
"""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    """What the step asks of `comm`; `own` holds one value per rank in `ranks`."""

    ranks: tuple[int, ...]
    world_size: int
    device: torch.device
    cp: object  # dist.context_parallel.ContextParallel of this process's context group, or None
    scores: bool  # whether this process's samples are scored here (False: another rank of its context group scores them)
    leader: bool  # the one process that writes the step's shared files (sample grids)

    def gather(self, own: list[torch.Tensor]) -> torch.Tensor: ...

    def mean(self, own: list[dict[str, float]]) -> dict[str, float]: ...


class RankCollectives:
    """This process is rank `rank` of a torch.distributed world of `world_size`; with `layout`
    (`dist.context_parallel.data_context_layout`) it plays its data-parallel rank."""

    def __init__(self, rank: int, world_size: int, device: torch.device, layout=None):
        self.device = device
        self._world = world_size  # every process, context-parallel ranks included
        self._stride = 1 if layout is None else layout.cp.size  # consecutive ranks form a context group
        self.cp = None if layout is None else layout.cp
        self.ranks = (rank if layout is None else layout.dp_rank,)
        self.world_size = world_size if layout is None else layout.dp_size
        self.scores = self.cp is None or self.cp.rank == 0
        self.leader = rank == 0

    def gather(self, own: list[torch.Tensor]) -> torch.Tensor:
        import torch.distributed as dist

        (tensor,) = own
        parts = [torch.empty_like(tensor) for _ in range(self._world)]
        dist.all_gather(parts, tensor.contiguous())
        # One value per data-parallel rank: its context group's first rank's (the one that scored).
        return torch.stack(parts[:: self._stride])

    def mean(self, own: list[dict[str, float]]) -> dict[str, float]:
        import torch.distributed as dist

        (values,) = own
        keys = sorted(values)
        vec = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec)
        # Over every process: a context group's ranks report one sample's numbers N times, so the
        # mean over the world is the mean over data-parallel ranks.
        vec /= self._world
        return dict(zip(keys, vec.tolist()))
