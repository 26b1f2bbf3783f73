"""The few collectives a checkpoint needs, each a no-op without a process group.

Every manager method that touches DCP is collective; these keep the ranks deciding together
(all raise, or none), since a rank that raises alone leaves the others waiting in the next
collective until the timeout.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch.distributed as dist

from cosmos_rl.dist.world import process_group_active, rank_and_world

__all__ = ["rank_and_world", "single_process", "quiet_single_process", "barrier"]


def single_process() -> bool:
    """No process group: DCP then runs locally (and would warn about it on every call)."""
    return not process_group_active()


@contextlib.contextmanager
def quiet_single_process():
    """DCP warns on every single-process call that it assumes a single process; that is
    exactly what we mean, so the warning only buries real ones."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def barrier() -> None:
    if not single_process():
        dist.barrier()


def gather_all(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    _, world = rank_and_world()
    if world == 1:
        return [value]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, value)
    return gathered


def agree(problems: list[str]) -> list[str]:
    """Every rank's problems, on every rank, each prefixed with its rank (when more than one)."""
    gathered = gather_all(problems)
    if len(gathered) == 1:
        return problems
    return [f"rank {rank}: {p}" for rank, rank_problems in enumerate(gathered) for p in rank_problems]


def from_rank0(value: Any) -> Any:
    _, world = rank_and_world()
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
