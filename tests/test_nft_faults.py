"""DiffusionNFT under faults, end to end on the session's Ray cluster with the real reward service.

- Preemption: `cosmos-rl train` in a subprocess joins the session cluster, gets SIGTERM after its
  first metrics row, commits a checkpoint and exits 75; `cosmos-rl resume RUN --exact` finishes,
  and metrics rows (minus time/*) and final weights equal an uninterrupted run.
- Reward faults: one run whose service fails transiently during step 1 (retried: nothing changes)
  and persistently from step 3 (exit 1, one line naming the reward service and the last committed
  checkpoint), then `resume --exact` against a restarted service that again fails transiently
  and finishes equal to the uninterrupted run.

One uninterrupted 3-step run (in-process) is the reference for both. Run start-up dominates the
cost on 2 cores, so the resumes go through the CLI in-process (no second import of the stack).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cosmos_rl.cli import app

from _reward_faults import FaultyRewardServer
from test_nft_ray import FAST, SMOKE, _checkpoint_tensors, _deterministic, _rows

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STEPS = 3  # the faulty run fails in step 3, so its resume runs the last step
RANKS = 4  # the smoke manifest's group_size: one /score request per rank per step
REVISION = "builtin-v1"  # what the smoke manifest pins
# test_nft_ray.py's fast settings without its [rl.eval] pass: evaluation scores in-process with
# brightness, apart from the reward service these faults hit, and its rows' exact resume is
# test_nft_ray.py's to prove; here it would only add an evaluation to every run.
FAULT_FAST = [o for o in FAST if not o.startswith("rl.eval.")] + ["rl.eval.every=0"]
# Fail fast: 3 attempts per request, 0.05 s then 0.1 s apart.
RETRY = ["rl.reward.max_retries=2", "rl.reward.backoff_s=0.05", "rl.reward.timeout_s=2"]
# Two faults at a time: even if one rank's request meets both, its third attempt succeeds.
TRANSIENT_1 = ("http_500", "garbage")
TRANSIENT_2 = ("drop_connection", "wrong_count")


def _overrides(root: Path, name: str, *extra: str) -> list[str]:
    return [*FAULT_FAST, f'job.output_dir="{root}"', f'job.name="{name}"', f"rl.max_steps={STEPS}", *extra]


def _env(ray_cluster) -> dict:
    # The subprocess joins the session cluster instead of starting a second one.
    address = ray_cluster.get_runtime_context().gcs_address
    return {**os.environ, "RAY_ADDRESS": address, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _cosmos(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cosmos_rl.cli", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _resume_cli(run_dir: Path, *overrides: str):
    """`cosmos-rl resume RUN --exact ...` through the real CLI, in this process."""
    return CliRunner().invoke(app, ["resume", str(run_dir), "--exact", *overrides])


def _committed(run_dir: Path) -> list[int]:
    return sorted(
        int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*") if (p / "COMMITTED").is_file()
    )


def _assert_same_weights(a_dir: Path, b_dir: Path, step: int, tmp: Path) -> None:
    a, b = _checkpoint_tensors(a_dir, step, tmp), _checkpoint_tensors(b_dir, step, tmp)
    weights = [k for k in a if k.startswith(("policy.", "old.", "optimizer."))]
    assert weights and set(a) == set(b)
    for key in weights:
        assert torch.equal(a[key], b[key]), key


# The uninterrupted, fault-free reference's settings (only the final checkpoint); tests/test_soak.py's
# NFT soak compares against the same run, which the session's `reference_runs` trains once for both.
STRAIGHT = [*FAULT_FAST, f"rl.max_steps={STEPS}", "checkpoint.every=100"]


@pytest.fixture(scope="module")
def straight(ray_cluster, reference_runs) -> Path:
    """The uninterrupted, fault-free reference: only the final checkpoint."""
    return reference_runs(SMOKE, STRAIGHT)


def test_sigterm_commits_exits_75_and_exact_resume_equals_the_straight_run(straight, ray_cluster, tmp_path):
    run_dir = tmp_path / "pre"
    proc = _cosmos(_env(ray_cluster), "train", str(SMOKE), *_overrides(tmp_path, "pre", "checkpoint.every=100"))
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().strip():
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be preempted: " + proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    committed = _committed(run_dir)
    # Only the preemption checkpoint exists (checkpoint.every=100), after the step that was running.
    assert len(committed) == 1 and 1 <= committed[0] < STEPS, committed
    assert f"resume {run_dir} --exact" in " ".join(stderr.split())
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, committed[0] + 1))

    result = _resume_cli(run_dir)
    assert result.exit_code == 0, result.output[-3000:]
    assert [_deterministic(r) for r in _rows(run_dir)] == [_deterministic(r) for r in _rows(straight)]
    _assert_same_weights(straight, run_dir, STEPS, tmp_path)


@pytest.fixture(scope="module")
def faulty(ray_cluster, tmp_path_factory) -> dict:
    """A run against a service that fails transiently in step 1 and persistently from step 3, then its
    resume against a restarted service that fails transiently once more. Records what each leg saw."""
    root = tmp_path_factory.mktemp("nft_faulty")
    run_dir = root / "faulty"
    facts: dict = {"run_dir": run_dir}
    with FaultyRewardServer("127.0.0.1", 0, revision=REVISION) as server:
        # Step 1: two faulted attempts, retried; then the rest of step 1 and all of step 2 answered
        # normally ("delay:0" answers at once); from step 3 every attempt fails in a way the client
        # retries, until the retries run out.
        server.inject_faults(*TRANSIENT_1, *["delay:0"] * (2 * RANKS), *["http_500", "garbage", "wrong_count"] * 20)
        proc = _cosmos(
            _env(ray_cluster), "train", str(SMOKE),
            # No periodic checkpoint before the outage: step 2 is committed only because the run
            # commits the last completed step when the service fails for good.
            *_overrides(root, "faulty", "checkpoint.every=0", f'rl.reward.url="{server.url}"', *RETRY),
        )  # fmt: skip
        try:
            _, facts["stderr"] = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
        facts["code"], facts["url"] = proc.returncode, server.url
    facts["committed"] = _committed(run_dir)
    facts["rows_at_failure"] = _rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []

    with FaultyRewardServer("127.0.0.1", 0, revision=REVISION) as restarted:  # a new service, on a new port
        restarted.inject_faults(*TRANSIENT_2)
        facts["resume"] = _resume_cli(run_dir, f'rl.reward.url="{restarted.url}"', *RETRY)
        facts["resume_requests"] = restarted.score_requests
    return facts


def test_transient_reward_faults_are_retried_and_change_nothing(faulty, straight):
    # Steps 1-2 ran through two retried faults; the resumed step 3 through two more.
    assert faulty["rows_at_failure"] and [r["step"] for r in faulty["rows_at_failure"]] == [1, 2], faulty["stderr"][-3000:]
    reference = [_deterministic(r) for r in _rows(straight)]
    assert [_deterministic(r) for r in faulty["rows_at_failure"]] == reference[:2]
    result = faulty["resume"]
    assert result.exit_code == 0, result.output[-3000:]
    assert faulty["resume_requests"] == (STEPS - 2) * RANKS + 2  # the two faults really hit the resumed run
    assert [_deterministic(r) for r in _rows(faulty["run_dir"])] == reference


def test_persistent_reward_faults_stop_with_one_line_naming_the_service_and_resume_point(faulty, straight, tmp_path):
    stderr, run_dir = faulty["stderr"], faulty["run_dir"]
    assert faulty["code"] == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    failed = [line for line in stderr.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1, stderr[-3000:]
    line = failed[0]
    assert "step 3" in line and "reward service" in line and faulty["url"] in line, line
    assert str(run_dir / "checkpoints" / "step_2") in line and f"cosmos-rl resume {run_dir} --exact" in line, line
    # Step 2, the last completed step, was committed when step 3's rewards failed for good (no
    # periodic checkpoint was due), and it was exact: the resume from it finished equal to the
    # straight run, weights included.
    assert faulty["committed"] == [2]
    assert faulty["resume"].exit_code == 0, faulty["resume"].output[-3000:]
    _assert_same_weights(straight, run_dir, STEPS, tmp_path)
