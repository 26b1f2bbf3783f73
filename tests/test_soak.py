"""Soak: runs that are interrupted over and over end exactly where a clean run ends.

- DPO under torchrun, SIGTERMed after every new metrics row and resumed with --exact each time.
- NFT on Ray against a `cosmos-rl reward serve` process that is SIGKILLed and restarted every
  step: the client's retries ride out each outage, and the metrics equal a clean run's.

Both loops are bounded in count and time and every process they start is on loopback. The clean
reference runs go through `launch.train` in this process (the stack is already imported here); only
the runs that are signalled or killed are `cosmos-rl` subprocesses, and the NFT run the killed
service serves is the real CLI in this process (tests/_inproc.py): its process is not the subject.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from _inproc import cosmos
from _overrides import DPO_SMALL
from cosmos_rl.commands import launch
from cosmos_rl.config import load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DPO = REPO / "manifests" / "dpo_t2i_smoke.toml"
NFT = REPO / "manifests" / "nft_t2i_smoke.toml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cosmos_rl.cli", *args], cwd=REPO, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "train/pairs_per_s"}


def _clean(manifest: Path, overrides: list[str]) -> None:
    """The uninterrupted reference run, in this process (what `cosmos-rl train` does, minus its start-up)."""
    assert launch.train(load.load(manifest, overrides), manifest, Console(stderr=True)) == 0


def test_dpo_sigtermed_after_every_few_steps_and_resumed_equals_a_clean_run(tmp_path):
    steps = 6
    args = [*DPO_SMALL, f"rl.max_steps={steps}", "rl.validation.every=0", "checkpoint.every=100"]
    _clean(DPO, [*args, f'job.output_dir="{tmp_path / "clean"}"'])

    run_dir = tmp_path / "soak" / "dpo_t2i_smoke"
    proc = _cli("train", str(DPO), *args, f'job.output_dir="{tmp_path / "soak"}"')
    stops = 0
    for _ in range(steps + 2):  # bounded: each leg makes progress or the test fails
        seen = len(_rows(run_dir))
        deadline = time.monotonic() + 240
        while proc.poll() is None and len(_rows(run_dir)) == seen and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
        if proc.returncode == 0:
            break
        assert proc.returncode == 75, err[-3000:]
        stops += 1
        proc = _cli("resume", str(run_dir), "--exact")
    assert proc.returncode == 0, err[-3000:]
    assert stops >= 2, "the run finished before it could be interrupted twice"
    clean_rows = _rows(tmp_path / "clean" / "dpo_t2i_smoke")
    assert [_deterministic(r) for r in _rows(run_dir)] == [_deterministic(r) for r in clean_rows]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int) -> subprocess.Popen:
    proc = _cli("reward", "serve", "--revision", "builtin-v1", "--port", str(port))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the reward service did not come up")


def test_nft_rides_out_a_reward_service_killed_and_restarted_every_step(ray_cluster, reference_runs, tmp_path):
    # 3 steps: a kill after each of the first two rows (the third row ends the run); the next row
    # needs the restarted service's scores, so it cannot slip past a kill and neither kill is skipped.
    from test_nft_faults import STEPS as steps
    from test_nft_faults import STRAIGHT as fast  # 3 small steps, only the final checkpoint

    # The clean run is tests/test_nft_faults.py's straight reference, trained once per session
    # (in this process, joining the session cluster).
    clean = reference_runs(NFT, fast)

    port = _free_port()
    service = {"proc": _serve(port), "kills": 0, "error": None}
    # Retries outlast a restart (exponential backoff: 0.25 s x 2^k, about 30 s in all).
    retry = ["rl.reward.max_retries=7", "rl.reward.backoff_s=0.25", "rl.reward.timeout_s=5"]
    run_dir = tmp_path / "soak" / "nft_t2i_smoke"
    finished = threading.Event()

    def kill_after_each_new_row():
        """While the run goes on (in this process's main thread), SIGKILL the service after each new
        metrics row but the last, and start it again on the same port."""
        try:
            deadline = time.monotonic() + 300
            seen = 0
            while not finished.is_set() and time.monotonic() < deadline:
                rows = len(_rows(run_dir))
                if rows > seen:
                    seen = rows
                    if rows < steps:
                        service["proc"].send_signal(signal.SIGKILL)  # mid-run, between two steps' requests
                        service["proc"].wait()
                        service["kills"] += 1
                        time.sleep(0.5)
                        service["proc"] = _serve(port)
                time.sleep(0.05)
        except BaseException as exc:  # re-raised in the test after the run
            service["error"] = exc

    killer = threading.Thread(target=kill_after_each_new_row, name="soak-killer", daemon=True)
    killer.start()
    try:
        done = cosmos("train", NFT, *fast, *retry, f'rl.reward.url="http://127.0.0.1:{port}"', f'job.output_dir="{tmp_path / "soak"}"')
    finally:
        finished.set()
        killer.join(timeout=120)
        service["proc"].kill()
        service["proc"].wait()
    if service["error"] is not None:
        raise service["error"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert service["kills"] >= 2
    assert [_deterministic(r) for r in _rows(run_dir)] == [_deterministic(r) for r in _rows(clean)]
