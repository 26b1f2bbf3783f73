"""Multi-rank checkpoints: FSDP2 + Adam saved on 2 gloo ranks, reloaded on 2 ranks and on 1;
base weights loaded into an FSDP2-sharded model.

Run as a script under torchrun it is the worker; under pytest it launches that worker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from cosmos_rl.checkpoint import (
    CheckpointError,
    CheckpointManager,
    ModelState,
    OptimizerState,
    RngStreams,
)

STEP = 1
BASE_SEED = 7


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.inner(x))


class Stack(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(Block() for _ in range(2))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def full_states(model, opt):
    """Unsharded model and optimizer state on CPU (gathered across ranks)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=options)
    optim_sd = get_optimizer_state_dict(model, opt, options=options)
    # Gathered onto rank 0 only; other ranks get empty dicts.
    moments = {f"{fqn}.{k}": v for fqn, s in optim_sd.get("state", {}).items() for k, v in s.items()}
    return model_sd, moments


def assert_equal_dicts(a, b, what):
    assert a.keys() == b.keys(), (what, sorted(a), sorted(b))
    for key in a:
        assert torch.equal(a[key], b[key]), (what, key)


def sharded_model(seed: int):
    from torch.distributed.fsdp import fully_shard

    model = Stack(seed)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def parts(model, opt):
    return {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, opt),
        "rng": RngStreams(),
        "train": {"step": STEP},
    }


def worker(run_dir: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt = sharded_model(seed=0)
    torch.manual_seed(100 + rank)  # rank-specific data and RNG streams
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()

    manager = CheckpointManager(run_dir, keep=0)
    manager.save(STEP, parts(model, opt))
    after_save = torch.rand(3)
    ref_model, ref_optim = full_states(model, opt)
    if rank == 0:
        torch.save({"model": ref_model, "optim": ref_optim}, run_dir / "reference.pt")

    model2, opt2 = sharded_model(seed=1)
    train = {}
    torch.manual_seed(12345)
    manager.load(STEP, {**parts(model2, opt2), "train": train})
    got_model, got_optim = full_states(model2, opt2)
    if rank == 0:
        assert_equal_dicts(ref_model, got_model, "model")
        assert_equal_dicts(ref_optim, got_optim, "optimizer")
        assert any(k.endswith("exp_avg_sq") for k in got_optim)
    assert train == {"step": STEP}
    assert torch.equal(torch.rand(3), after_save), "this rank's RNG stream was not restored"

    # Base weights (a diffusers-style safetensors folder) load into an already sharded model.
    from cosmos_rl.models.base_checkpoint import load_base_weights

    model3, opt3 = sharded_model(seed=1)
    load_base_weights(model3, run_dir / "base", [])
    got_base, _ = full_states(model3, opt3)
    if rank == 0:
        assert_equal_dicts(Stack(seed=BASE_SEED).state_dict(), got_base, "base weights")

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # docs/topology.md "Platform traps": interpreter shutdown after DCP sometimes aborts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_rank_fsdp_checkpoint_reloads_on_two_ranks_and_on_one(tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        __file__, str(tmp_path),
    ]  # fmt: skip
    from safetensors.torch import save_file

    (tmp_path / "base" / "transformer").mkdir(parents=True)
    save_file(Stack(seed=BASE_SEED).state_dict(), tmp_path / "base" / "transformer" / "model.safetensors")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # Resharding: the 2-rank checkpoint loads into one unsharded process.
    reference = torch.load(tmp_path / "reference.pt", weights_only=True)
    model = Stack(seed=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    manager = CheckpointManager(tmp_path, keep=0)
    meta = manager.read_meta(STEP)
    assert meta["world_size"] == 2
    # The two ranks hashed half the files each; meta.json holds every file's checksum.
    assert set(meta["checksums"]) == set(meta["files"]) and len(meta["files"]) >= 3
    manager.load(STEP, {"model": ModelState(model), "optimizer": OptimizerState(model, opt)})
    got_model, got_optim = full_states(model, opt)
    assert_equal_dicts(reference["model"], got_model, "model")
    assert_equal_dicts(reference["optim"], got_optim, "optimizer")

    # Per-rank RNG streams cannot continue exactly on another world size.
    with pytest.raises(CheckpointError, match="'rng' is per-rank and was saved by 2 ranks; this run has 1"):
        manager.load(STEP, {"rng": RngStreams()})


if __name__ == "__main__":
    try:
        worker(Path(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
