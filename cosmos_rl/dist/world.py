"""Process-group and device plumbing shared by the torchrun and Ray backends (no math here)."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

from cosmos_rl.dist.addresses import is_loopback


def process_group_active() -> bool:
    """The one answer to "is this process part of a torch.distributed world?"."""
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside a process group."""
    if process_group_active():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def pick_device(setting: str, local_rank: int = 0) -> torch.device:
    """`grid.device` -> the torch device of this rank; `cuda` without a GPU is a user error."""
    from cosmos_rl.core.errors import UserError

    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError('grid.device: "cuda" asked for, but no CUDA device is visible; set grid.device = "cpu" or "auto"')
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def loopback_gloo() -> None:
    """Keep gloo's own sockets on loopback for single-host runs (it otherwise binds the host's address)."""
    if is_loopback(os.environ.get("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def init_process_group(
    device: torch.device, rank: int, world_size: int, timeout_s: float, *, store_file: str | None = None
) -> None:
    """Join the world through MASTER_ADDR/MASTER_PORT, or through `store_file` when every rank shares
    one host: torch's TCPStore listens on every interface whatever address it is given, a file
    store opens no socket at all."""
    loopback_gloo()
    store = dist.FileStore(store_file, world_size) if store_file else None
    dist.init_process_group(
        backend_for(device), rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None, store=store,
    )


def finish_worker(code: int) -> None:
    """End a torchrun worker: tear down the group, flush, and skip interpreter teardown.

    DCP under torchrun sometimes aborts at interpreter shutdown after all work is done
    (docs/topology.md); leaving through os._exit avoids it.
    """
    if process_group_active():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
