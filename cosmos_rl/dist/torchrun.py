"""What torchrun tells a worker about its place in the job (the only reader of torchrun's env)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cosmos_rl.core.errors import RunFailed


@dataclass(frozen=True)
class TorchrunRank:
    rank: int
    local_rank: int
    world_size: int


def torchrun_rank() -> TorchrunRank:
    """RANK / LOCAL_RANK / WORLD_SIZE as torchrun sets them; missing ones mean we were not launched by it."""
    try:
        return TorchrunRank(
            rank=int(os.environ["RANK"]),
            local_rank=int(os.environ["LOCAL_RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    except (KeyError, ValueError) as exc:
        raise RunFailed(
            f"not started by torchrun (environment variable {exc} missing or malformed); "
            "launch with `cosmos-rl train MANIFEST`"
        ) from None
