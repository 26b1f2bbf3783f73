"""The DPO smoke (2 steps, world size 2, same seed) gives the same train/ and val/ rows however it is
launched: one torchrun agent with 2 ranks (the reference), two torchrun agents of one rank each
meeting at a c10d rendezvous on 127.0.0.1 (multi-node on one machine), and Ray actors with
grid.grouping "single" and "per_role". Exact equality holds on CPU (one thread per rank everywhere),
so it is asserted exactly. Also: a SIGTERM to the Ray driver commits a checkpoint and ends in
Preempted, as under torchrun. ~90-110 s on 2 cores.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from rich.console import Console

from cosmos_rl.checkpoint import load_dcp, read_dcp_metadata
from _overrides import DPO_SMALL_WITH_VALIDATION

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "dpo_t2i_smoke.toml"
TINY = ["rl.max_steps=2", *DPO_SMALL_WITH_VALIDATION]
# Loopback only: gloo's sockets and the address each torchrun agent advertises (PET_ = torchrun's env form).
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo", "PET_LOCAL_ADDR": "127.0.0.1"}


def metrics_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "train/pairs_per_s"} for row in rows]  # wall-clock


def cursor_state(step_dir: Path) -> dict:
    metadata = read_dcp_metadata(step_dir).state_dict_metadata["data_cursor.json"]
    state = {"data_cursor.json": torch.empty(metadata.size, dtype=metadata.properties.dtype)}
    load_dcp(state, step_dir)
    return json.loads(bytes(state["data_cursor.json"].tolist()))


def train_cli(root: Path, name: str, *extra: str) -> subprocess.Popen:
    argv = ["cosmos-rl", "train", str(MANIFEST), *TINY, f'job.output_dir="{root}"', f'job.name="{name}"', *extra]
    return subprocess.Popen(argv, cwd=root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One torchrun agent, --nnodes 1 --nproc-per-node 2."""
    root = tmp_path_factory.mktemp("dpo_backends")
    out = finish(train_cli(root, "one_agent"))
    assert "--nnodes=1 --nproc-per-node=2" in out
    rows = metrics_rows(root / "one_agent")
    assert [r["step"] for r in rows] == [1, 2] and "val/loss" in rows[1]
    return root


def test_two_torchrun_agents_match_one_agent(reference):
    root = reference
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Each "node" runs `cosmos-rl train` with the same manifest, i.e. plan.torchrun_argv for its share.
    nodes = ["grid.nodes=2", "grid.gpus_per_node=1", f'grid.rdzv_endpoint="127.0.0.1:{port}"']
    agents = [train_cli(root, "two_agents", *nodes) for _ in range(2)]
    outs = [finish(agent) for agent in agents]
    for out in outs:
        assert f"--nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port}" in out
    assert metrics_rows(root / "two_agents") == metrics_rows(root / "one_agent")
    meta = json.loads((root / "two_agents" / "checkpoints" / "step_2" / "meta.json").read_text())
    assert meta["world_size"] == 2


@pytest.mark.parametrize("grouping", ["single", "per_role"])
def test_ray_backend_matches_torchrun(reference, ray_cluster, grouping):
    from cosmos_rl.commands import launch
    from cosmos_rl.config import load

    root = reference
    name = f"ray_{grouping}"
    overrides = [*TINY, f'job.output_dir="{root}"', f'job.name="{name}"', 'grid.backend="ray"', f'grid.grouping="{grouping}"']
    config = load.load(MANIFEST, overrides)
    console = Console(file=io.StringIO())
    # In-process, so the group joins the session's Ray cluster instead of starting a second one.
    assert launch.train(config, MANIFEST, console) == 0
    assert f"2 Ray actors ({grouping})" in console.file.getvalue()
    placement = json.loads((root / name / "placement.json").read_text())
    assert sorted(int(r["rank"]) for r in placement["ranks"]) == [0, 1]
    assert metrics_rows(root / name) == metrics_rows(root / "one_agent")
    step_dir = root / name / "checkpoints" / "step_2"
    assert (step_dir / "COMMITTED").is_file()
    # The cursor in the checkpoint is the one that served the pairs (the data actor's under per_role).
    assert cursor_state(step_dir)["step"] == 2
    assert cursor_state(step_dir) == cursor_state(root / "one_agent" / "checkpoints" / "step_2")


def test_ray_backend_sigterm_commits_a_checkpoint_and_raises_preempted(tmp_path, ray_cluster):
    import signal
    import threading
    import time

    from cosmos_rl.commands import launch
    from cosmos_rl.config import load
    from cosmos_rl.core.errors import Preempted

    overrides = [*TINY, f'job.output_dir="{tmp_path}"', 'job.name="pre"', 'grid.backend="ray"',
                 "rl.max_steps=100000", "checkpoint.every=0", "rl.validation.every=0"]  # fmt: skip
    config = load.load(MANIFEST, overrides)
    metrics = tmp_path / "pre" / "metrics.jsonl"

    def signal_after_two_steps():  # the scheduler's SIGTERM reaches the driver (this process) only
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                os.kill(os.getpid(), signal.SIGTERM)  # only once training runs: the driver's handler is in place
                return
            time.sleep(0.2)

    threading.Thread(target=signal_after_two_steps, daemon=True).start()
    with pytest.raises(Preempted, match="resume"):
        launch.train(config, MANIFEST, Console(file=io.StringIO()))
    steps = [int(p.name.split("_")[1]) for p in (tmp_path / "pre" / "checkpoints").glob("step_*")
             if (p / "COMMITTED").is_file()]  # fmt: skip
    assert len(steps) == 1 and steps[0] >= 2
