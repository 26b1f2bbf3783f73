"""Stop signals sent to the whole process group, and nothing left behind after a SIGKILL.

Ctrl-C in a terminal, `timeout` and schedulers signal every process of the foreground group, not
just `cosmos-rl`. Each run here is `cosmos-rl train` started in a session of its own
(`start_new_session=True`), so `os.killpg` reaches exactly that run's group (never pytest's): the
run must still finish its step, commit, exit 75, and `resume --exact` must continue from it.
Three legs per NFT run (SIGTERM, SIGINT, SIGKILL) share one run directory to start Ray as few
times as possible: starting is most of the cost on 2 cores.

Every run gets a private TMPDIR and a marker variable that all its descendants inherit, so "left
behind" is checked without guessing process names: after the run is gone, no process carries the
marker and the TMPDIR holds no Ray folder. The runs start their own local Ray cluster (no
RAY_ADDRESS), which is the case the group signal used to break.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from _overrides import DPO_SMALL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NFT = REPO / "manifests" / "nft_t2i_smoke.toml"
DPO = REPO / "manifests" / "dpo_t2i_smoke.toml"
# A group of 2 samples, so 2 actors instead of the manifest's 4: what the signals reach and what a
# SIGKILL leaves behind does not depend on how many actors there are, and each one's start imports
# the stack (each leg starts its own, on a fresh cluster).
NFT_FAST = ["rl.sample_steps=4", "rl.timesteps_per_sample=1", "job.progress=false", "checkpoint.keep=0", "rl.group_size=2"]
MARK = "COSMOS_RL_TEST_RUN_MARK"
START_S = 300  # a loaded 2-core machine: Ray start-up plus the first step


@pytest.fixture
def run_env():
    """(env, tmpdir): a short private TMPDIR (Ray's socket paths must stay short) and a marker."""
    tmp = tempfile.mkdtemp(prefix="crl-sig-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"TMPDIR": tmp, MARK: uuid.uuid4().hex, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"})
    try:
        yield env, Path(tmp)
    finally:
        for pid in _marked(env[MARK]):  # a failed test must not leave its run behind either
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries `mark` (every descendant of a run inherits it)."""
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _names(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80])
        except OSError:
            pass
    return out


def _assert_nothing_left(env: dict, tmp: Path, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left, folders = _marked(env[MARK]), sorted(p.name for p in tmp.glob("cosmos-rl-ray-*"))
        if not left and not folders:
            return
        time.sleep(0.5)
    assert not left, f"left running: {_names(left)}"
    assert not folders, f"left in TMPDIR: {folders}"


def _cosmos(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cosmos_rl.cli", *args], cwd=REPO, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _rows(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _committed(run_dir: Path) -> list[int]:
    return sorted(int(p.parent.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*/COMMITTED"))


def _signal_group_after_a_step(proc: subprocess.Popen, run_dir: Path, sig: int, after: int) -> str:
    """Wait until metrics has a row past step `after`, signal the run's whole group, return stderr."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None:
        if any(step > after for step in _rows(run_dir)):
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before the signal: " + proc.communicate()[1][-3000:]
    os.killpg(proc.pid, sig)  # proc leads its own session: this is the run's group, not pytest's
    _, stderr = proc.communicate(timeout=240)
    return stderr


def _stop_then_resume_and_stop(env: dict, tmp: Path, manifest: Path, overrides: list[str]) -> Path:
    """train, SIGTERM to the group -> 75 and one committed step; resume --exact, SIGINT to the
    group -> 75, its rows continuing the first leg's and a later committed step. Returns the run."""
    run_dir = tmp / "run"
    common = [f'job.output_dir="{tmp}"', 'job.name="run"']
    proc = _cosmos(env, "train", str(manifest), *overrides, *common, "rl.max_steps=1000")
    stderr = _signal_group_after_a_step(proc, run_dir, signal.SIGTERM, after=0)
    assert proc.returncode == 75, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    first = _committed(run_dir)
    assert len(first) == 1 and first[0] >= 1, (first, stderr[-2000:])
    assert _rows(run_dir) == list(range(1, first[0] + 1))
    assert f"resume {run_dir} --exact" in " ".join(stderr.split())
    _assert_nothing_left(env, tmp)

    proc = _cosmos(env, "resume", str(run_dir), "--exact")
    stderr = _signal_group_after_a_step(proc, run_dir, signal.SIGINT, after=first[0])
    assert proc.returncode == 75, stderr[-3000:]
    assert "received: finishing this step" in stderr, stderr[-3000:]  # torchrun: forwarded as SIGTERM
    assert "Traceback" not in stderr, stderr[-3000:]
    second = _committed(run_dir)
    assert len(second) == 2 and second[-1] > first[0], (second, stderr[-2000:])
    assert _rows(run_dir) == list(range(1, second[-1] + 1))  # continued from the commit, each step once
    _assert_nothing_left(env, tmp)
    return run_dir


def test_nft_on_ray_stops_on_group_sigterm_and_sigint_and_a_sigkill_leaves_nothing(run_env):
    """After the two stops, a third leg resumes and its driver alone is SIGKILLed (no handler
    runs): Ray's head, in its own session, sees the driver go and takes its daemons, agents,
    workers, temp folder and the ranks' rendezvous file with it."""
    env, tmp = run_env
    run_dir = _stop_then_resume_and_stop(env, tmp, NFT, [*NFT_FAST, "checkpoint.every=0"])
    done = _committed(run_dir)[-1]
    proc = _cosmos(env, "resume", str(run_dir), "--exact")
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None and max(_rows(run_dir)) <= done:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert len(_marked(env[MARK])) > 3  # the driver, Ray's daemons and the actors are running
    assert list(tmp.glob("cosmos-rl-store-*")) and list(tmp.glob("cosmos-rl-ray-*"))
    proc.kill()
    proc.communicate(timeout=30)
    _assert_nothing_left(env, tmp)
    assert not list(tmp.glob("cosmos-rl-store-*"))


def test_dpo_under_torchrun_stops_on_group_sigterm_and_sigint(run_env):
    env, tmp = run_env
    _stop_then_resume_and_stop(env, tmp, DPO, [*DPO_SMALL, "checkpoint.every=0"])


def test_reward_serve_with_replicas_leaves_no_ray_process_and_no_temp_folder(run_env):
    """`reward serve --replicas 1` on a local cluster, stopped by SIGTERM as an operator stops it."""
    env, tmp = run_env
    proc = _cosmos(env, "reward", "serve", "--revision", "r1", "--port", "0", "--replicas", "1", "--cpus-per-replica", "0.5")
    line = proc.stdout.readline()  # blocks until the replicas run (or the command fails)
    assert "listening on http://127.0.0.1:" in line, line + proc.communicate(timeout=60)[1][-3000:]
    assert list(tmp.glob("cosmos-rl-ray-*")) and len(_marked(env[MARK])) > 3
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    _assert_nothing_left(env, tmp)
