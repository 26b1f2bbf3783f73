"""Checkpoint/resume hardening, end to end through `cosmos-rl train` / `resume` under torchrun.

One 2-rank, 2-step DPO run (checkpoint at step 2) is trained once per module; every test resumes a
private copy of it (a run directory may be moved: `resume` keeps it where it is). Tests:
a non-exact resume onto a different world size, an incomplete step directory, a corrupt newest
checkpoint, keep-k pruning beside an incomplete newer directory, and a save into a full filesystem.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from cosmos_rl.checkpoint import CheckpointError, CheckpointManager, CheckpointWriteError, ModelState, OptimizerState, load_dcp, read_dcp_metadata
from _inproc import cosmos as inproc_cosmos
from _overrides import DPO_SMALL

from cosmos_rl.core.errors import EXIT_FAILED, exit_code_for

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "dpo_t2i_smoke.toml"
SMALL = [*DPO_SMALL, "rl.validation.every=0"]
ONE_RANK = ["model.config.parallelism.data_parallel_shard_degree=1", "grid.gpus_per_node=1"]


def cosmos(*args: str, cwd: Path):
    """`cosmos-rl ARGS` through the real CLI in this process (tests/_inproc.py): exit codes, words
    and the files left are the subject; the command still launches its torchrun ranks as processes."""
    return inproc_cosmos(*args, cwd=cwd, env={"HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"})


def steps_in_metrics(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_dirs(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def committed(run_dir: Path) -> list[int]:
    return CheckpointManager(run_dir, keep=0).committed_steps()


def adam_step_counts(step_dir: Path) -> set[float]:
    metadata = read_dcp_metadata(step_dir)
    state = {
        key: torch.empty(md.size, dtype=md.properties.dtype)
        for key, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and key.startswith("optimizer.state.") and key.endswith(".step")
    }
    assert state, "no Adam step counters in the checkpoint"
    load_dcp(state, step_dir)
    return {float(t) for t in state.values()}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume_hardening")
    proc = cosmos("train", str(MANIFEST), *SMALL, f'job.output_dir="{root}"', 'job.name="base"', "rl.max_steps=2", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = root / "base"
    assert committed(run_dir) == [2] and steps_in_metrics(run_dir) == [1, 2]
    return run_dir


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(base_run, dest)
    return dest


@pytest.mark.slow
def test_world_size_change_refused_with_exact_and_resharded_without(run_copy):
    refused = cosmos("resume", str(run_copy), "--exact", *ONE_RANK, "rl.max_steps=4", cwd=run_copy.parent)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "model.config.parallelism.data_parallel_shard_degree" in refused.stderr
    assert "grid.gpus_per_node" in refused.stderr
    assert step_dirs(run_copy) == ["step_2"] and steps_in_metrics(run_copy) == [1, 2]

    resumed = cosmos("resume", str(run_copy), *ONE_RANK, "rl.max_steps=4", cwd=run_copy.parent)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = " ".join((resumed.stdout + resumed.stderr).split())
    assert "world size changed: DCP reshards" in out
    assert "--nproc-per-node=1" in out  # really continued on one rank
    assert steps_in_metrics(run_copy) == [1, 2, 3, 4]
    assert committed(run_copy) == [2, 4]
    meta = json.loads((run_copy / "checkpoints" / "step_4" / "meta.json").read_text())
    assert meta["world_size"] == 1
    # The Adam moments came from step_2 (step counter 2) and took two more steps; a fresh optimizer
    # would have counted only 2.
    assert adam_step_counts(run_copy / "checkpoints" / "step_2") == {2.0}
    assert adam_step_counts(run_copy / "checkpoints" / "step_4") == {4.0}


@pytest.mark.slow
def test_incomplete_step_directories_are_skipped_with_a_warning(run_copy):
    ckpts = run_copy / "checkpoints"
    shutil.copytree(ckpts / "step_2", ckpts / "step_4")
    (ckpts / "step_4" / "COMMITTED").unlink()
    shutil.copytree(ckpts / "step_2", ckpts / "step_3.tmp-0badc0de")
    (ckpts / "step_3.tmp-0badc0de" / "COMMITTED").unlink()

    proc = cosmos("resume", str(run_copy), "--exact", "rl.max_steps=3", cwd=run_copy.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # It continued from step_2 (the last committed), not from the marker-less step_4.
    assert steps_in_metrics(run_copy) == [1, 2, 3]
    log = (run_copy / "logs" / "rank0.log").read_text()
    assert f"ignoring checkpoint {ckpts / 'step_4'}: no COMMITTED marker" in log
    assert "resumed from " + str(ckpts / "step_2") in log
    # The new save committed step_3 and swept the crashed save's scratch directory.
    assert committed(run_copy) == [2, 3]
    assert "step_3.tmp-0badc0de" not in step_dirs(run_copy)


@pytest.mark.slow
def test_corrupt_newest_checkpoint_fails_loudly_and_writes_nothing(run_copy):
    step_dir = run_copy / "checkpoints" / "step_2"
    shard = step_dir / "__1_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    metrics_before = (run_copy / "metrics.jsonl").read_bytes()
    dirs_before = step_dirs(run_copy)

    proc = cosmos("resume", str(run_copy), "rl.max_steps=4", cwd=run_copy.parent)
    assert proc.returncode != 0
    assert proc.returncode == 2, proc.stderr[-3000:]  # a CheckpointError is the user's to fix
    err = " ".join(proc.stderr.split())
    assert str(step_dir) in err and "__1_0.distcp" in err and "expected" in err
    assert step_dirs(run_copy) == dirs_before
    assert (run_copy / "metrics.jsonl").read_bytes() == metrics_before


# ------------------------------------------------------------------------- in-process checks


class Net(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)


def trained(width: int, seed: int):
    torch.manual_seed(seed)
    model = Net(width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.lin(torch.randn(2, width)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def test_prune_keep_1_keeps_the_newest_committed_beside_an_incomplete_newer_dir(tmp_path):
    model, opt = trained(4, 0)
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(1, {"model": ModelState(model), "optimizer": OptimizerState(model, opt)})
    # A newer, marker-less step directory must not count as "newest" and push step 1 out.
    (tmp_path / "checkpoints" / "step_5").mkdir()
    assert manager.prune() == []
    assert manager.committed_steps() == [1]
    manager.save(2, {"model": ModelState(model), "optimizer": OptimizerState(model, opt)})
    assert manager.committed_steps() == [2]
    assert (tmp_path / "checkpoints" / "step_5").is_dir()  # not ours to delete


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs (root can mount here); the caller skips nothing: if mounting fails the
    test runs against a monkeypatched ENOSPC writer instead (see the test)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    try:
        yield mnt if proc.returncode == 0 else None
    finally:
        if proc.returncode == 0:
            subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_during_save_keeps_the_previous_checkpoint(tiny_fs, tmp_path, monkeypatch):
    run_dir = tiny_fs if tiny_fs is not None else tmp_path / "run"
    manager = CheckpointManager(run_dir, keep=0)
    model, opt = trained(8, 0)
    manager.save(1, {"model": ModelState(model), "optimizer": OptimizerState(model, opt)})
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    if tiny_fs is None:
        real = dcp.FileSystemWriter

        class FullWriter(real):
            def write_data(self, plan, planner):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(dcp, "FileSystemWriter", FullWriter)

    big, big_opt = trained(128, 1)  # ~200 KiB of weights + moments: cannot fit in 64 KiB
    with pytest.raises(CheckpointWriteError) as info:
        manager.save(2, {"model": ModelState(big), "optimizer": OptimizerState(big, big_opt)})
    message = str(info.value)
    assert "\n" not in message
    assert exit_code_for(info.value) == EXIT_FAILED  # a full disk is a runtime failure, not a usage error
    assert f"writing checkpoint {run_dir / 'checkpoints' / 'step_2'} failed" in message
    assert "out of disk space?" in message and "earlier checkpoints are intact" in message
    # The size named: weights + Adam's two moments (float32) + one float32 step count per parameter.
    params = list(big.parameters())
    expected = sum(p.numel() for p in params) * 4 * 3 + 4 * len(params)
    assert f"holds about {expected / 2**20:.2f} MiB of tensors, every rank's share together" in message
    assert manager.committed_steps() == [1]
    # No committed step_2, and no partial files left to keep the disk full.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_1"]

    fresh_model, fresh_opt = trained(8, 7)
    manager.load(1, {"model": ModelState(fresh_model), "optimizer": OptimizerState(fresh_model, fresh_opt)})
    for key, value in reference.items():
        assert torch.equal(fresh_model.state_dict()[key], value), key
