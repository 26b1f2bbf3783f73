"""Multi-node Ray: the NFT smoke on a simulated two-node cluster (`ray.cluster_utils.Cluster`, a
head and one worker node, both on 127.0.0.1), joined through grid.ray_address.

The session fixture owns this process's Ray, so the two-node cluster, the driver and its actors
live in a subprocess (this file run as a script), which shuts the cluster down in `finally`. Each
node has 1 CPU and each of the 4 ranks asks 0.5, with grid.nodes = 2 (SPREAD): the ranks must land
on both nodes, and the process group forms across them.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "manifests" / "nft_t2i_smoke.toml"
STEPS = 2
# The cheapest NFT step (as test_group_signals.py's): 4 sampler steps, 1 training timestep per sample,
# no progress bar; what is checked here is where the ranks run and that they train together.
FAST = ["rl.sample_steps=4", "rl.timesteps_per_sample=1", "job.progress=false", "checkpoint.keep=0"]
CHILD_TIMEOUT_S = 240
RUN_DIR_TAG = "RUN_DIR="


# ----------------------------------------------------------------------------- fast unit checks
def test_master_address_is_rank0_node_ip_once_ranks_span_nodes():
    from cosmos_rl.dist.ray_group import master_address

    one_node = [("a", "10.0.0.1")] * 4
    assert master_address(("127.0.0.1", 1234), one_node) == ("127.0.0.1", 1234)
    two_nodes = [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("a", "10.0.0.1"), ("b", "10.0.0.2")]
    assert master_address(("127.0.0.1", 1234), two_nodes) == ("10.0.0.1", 1234)
    # Rank 0 on the second node: its address, not the first node's.
    assert master_address(("127.0.0.1", 99), [("b", "10.0.0.2"), ("a", "10.0.0.1")]) == ("10.0.0.2", 99)


def test_gloo_is_pinned_to_loopback_only_for_loopback_masters():
    from cosmos_rl.dist.ray_group import ACTOR_ENV, is_loopback

    assert "GLOO_SOCKET_IFNAME" not in ACTOR_ENV  # never for every actor: it breaks multi-host gloo
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.1.1", "localhost", "::1"))
    assert not any(is_loopback(h) for h in ("10.0.0.1", "192.168.1.5", "node-0", "fe80::1", ""))


# ----------------------------------------------------------------------------- the two-node run
def _ours(marker: str) -> list[int]:
    """Pids of live processes whose command line names `marker` (the child's private Ray temp dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_nft_on_two_simulated_nodes_spreads_ranks_and_trains(tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="crl-mn-")  # short: Ray's unix socket paths live under it
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GLOO_SOCKET_IFNAME")}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env["RAY_TMPDIR"] = ray_tmp  # sessions and the cluster-address file under it, not /tmp/ray
    began = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, __file__, str(tmp_path), ray_tmp], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = child.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child's own session: its driver and Ray processes
        out, _ = child.communicate()
        pytest.fail(f"the two-node run took over {CHILD_TIMEOUT_S} s:\n{out[-4000:]}")
    elapsed = time.monotonic() - began
    assert child.returncode == 0, out[-6000:]

    # No Ray process of the child's cluster outlives it (GCS, raylets, workers all name its temp dir).
    deadline = time.monotonic() + 20
    while (left := _ours(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # ours: clean up before failing
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"Ray processes left after the cluster shut down: {left}"

    run_dir = Path(next(line for line in out.splitlines() if line.startswith(RUN_DIR_TAG))[len(RUN_DIR_TAG):])
    placement = json.loads((run_dir / "placement.json").read_text())
    assert [r["rank"] for r in placement["ranks"]] == [0, 1, 2, 3]
    node_of = {r["rank"]: r["node_id"] for r in placement["ranks"]}
    assert len(set(node_of.values())) == 2, placement  # ranks on BOTH nodes
    assert len(placement["nodes"]) == 2 and all(len(n["ranks"]) == 2 for n in placement["nodes"].values())
    assert placement["strategy"] == "SPREAD"
    assert placement["master_addr"] == placement["ranks"][0]["node_ip"] == "127.0.0.1"  # simulated: loopback
    # The driver's one-line summary names both nodes (by ip and node-id prefix) and their ranks.
    summary = next(line for line in out.splitlines() if "4 ranks on 2 nodes: " in line)
    for node_id, node in placement["nodes"].items():
        assert f"127.0.0.1 (node {node_id[:8]}) ranks {','.join(map(str, node['ranks']))}" in summary

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert math.isfinite(row["train/reward_mean"]) and 0.0 <= row["train/reward_mean"] <= 1.0
    print(f"two-node NFT run: {elapsed:.1f} s in all")


# ----------------------------------------------------------------------------- the child process
def _child(out_root: str, ray_tmp: str) -> int:
    """Start a head + one worker node on loopback, run the NFT smoke against it, shut it down."""
    import shutil

    from ray.cluster_utils import Cluster
    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.config import load

    t0 = time.monotonic()
    node_args = {"num_cpus": 1, "include_dashboard": False}
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=node_args)
        cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        print(f"cluster of 2 nodes at {cluster.address} up in {time.monotonic() - t0:.1f} s", flush=True)
        overrides = [
            *FAST, f'job.output_dir="{out_root}"', 'job.name="two_nodes"', f"rl.max_steps={STEPS}",
            "rl.sample_grid_every=0", "checkpoint.every=0", f'grid.ray_address="{cluster.address}"',
            "grid.nodes=2", "grid.cpus_per_rank=0.5", "grid.timeout_s=120",
        ]  # fmt: skip
        config = load.load(SMOKE, overrides)
        t1 = time.monotonic()
        code = launch.train(config, SMOKE, Console(stderr=True))
        print(f"nft run: exit {code} in {time.monotonic() - t1:.1f} s", flush=True)
        print(f"{RUN_DIR_TAG}{Path(out_root) / 'two_nodes'}", flush=True)
        return code
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
