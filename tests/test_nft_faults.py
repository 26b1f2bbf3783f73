"""DiffusionNFT under faults, end to end on the session's Ray cluster with the real reward service.

One run goes through every stop this file proves, each leg `cosmos-rl` through the real CLI in this
process (tests/_inproc.py: its exit code and its stderr, without a second import of the stack), against
a reward service this test hosts:

- Preemption: the first leg (`train`) gets SIGTERM once step 1's first /score request arrives,
  finishes step 1, commits it and exits 75; the second leg is its `resume --exact`.
- Reward faults: the service fails transiently during step 1 (retried: nothing changes) and
  persistently from step 3, so the second leg exits 1 with one line naming the reward service
  and the last committed checkpoint (step 2, committed because the service failed for good); a
  third leg, `resume --exact` against a restarted service that again fails transiently, finishes.

The rows of steps 1-2 and the finished run (rows and final weights) equal one uninterrupted,
fault-free 3-step run (in-process, shared with tests/test_soak.py). A real process's exit 75 on a
signal, the signal reaching the whole group included, is tests/test_group_signals.py's subject.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cosmos_rl.cli import app

from _inproc import cosmos, stop_self_when, stop_watch
from _reward_faults import FaultyRewardServer
from test_nft_ray import FAST, SMOKE, _checkpoint_tensors, _deterministic, _rows

pytestmark = pytest.mark.slow

STEPS = 3  # the faulty run fails in step 3, so its resume runs the last step
RANKS = 2  # FAULT_FAST's group_size: one /score request per rank per step
REVISION = "builtin-v1"  # what the smoke manifest pins
# test_nft_ray.py's fast settings without its [rl.eval] pass: evaluation scores in-process with
# brightness, apart from the reward service these faults hit, and its rows' exact resume is
# test_nft_ray.py's to prove; here it would only add an evaluation to every run. A group of 2
# samples, so 2 actors instead of the manifest's 4: faults and stops are the subject here, not the
# world's size (test_nft_ray.py's four-actor world), and each actor's start imports the stack.
FAULT_FAST = [o for o in FAST if not o.startswith("rl.eval.")] + ["rl.eval.every=0", f"rl.group_size={RANKS}"]
# Fail fast: 3 attempts per request, 0.05 s then 0.1 s apart.
RETRY = ["rl.reward.max_retries=2", "rl.reward.backoff_s=0.05", "rl.reward.timeout_s=2"]
# Two faults at a time: even if one rank's request meets both, its third attempt succeeds.
TRANSIENT_1 = ("http_500", "garbage")
TRANSIENT_2 = ("drop_connection", "wrong_count")


def _overrides(root: Path, name: str, *extra: str) -> list[str]:
    return [*FAULT_FAST, f'job.output_dir="{root}"', f'job.name="{name}"', f"rl.max_steps={STEPS}", *extra]


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


@pytest.fixture(scope="module")
def faulty(ray_cluster, tmp_path_factory) -> dict:
    """The three legs of the one run (the module's docstring), each through the CLI in this process.
    Records what each leg saw."""
    root = tmp_path_factory.mktemp("nft_faulty")
    run_dir = root / "faulty"
    facts: dict = {"run_dir": run_dir}
    with FaultyRewardServer("127.0.0.1", 0, revision=REVISION) as server:
        # Step 1: two faulted attempts, retried; then the rest of step 1 and all of step 2 answered
        # normally ("delay:0" answers at once); from step 3 every attempt fails in a way the client
        # retries, until the retries run out.
        server.inject_faults(*TRANSIENT_1, *["delay:0"] * (2 * RANKS), *["http_500", "garbage", "wrong_count"] * 20)
        # The SIGTERM goes at step 1's first /score request, so the stop lands in step 1 however
        # loaded the machine is (after step 1 the run would already be finishing a later step).
        watcher = stop_self_when(lambda: server.score_requests > 0)
        # No periodic checkpoint: step 1 is committed by the stop, step 2 only because the run
        # commits the last completed step when the service fails for good.
        facts["stopped"] = cosmos("train", SMOKE, *_overrides(root, "faulty", "checkpoint.every=0", f'rl.reward.url="{server.url}"', *RETRY))
        facts["signalled"] = stop_watch(watcher)
        facts["committed_at_stop"] = _committed(run_dir)
        facts["rows_at_stop"] = _rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        # The saved manifest keeps the service's URL: the resume scores at the same service.
        facts["failed"] = cosmos("resume", run_dir, "--exact")
        facts["url"] = server.url
    facts["committed"] = _committed(run_dir)
    facts["rows_at_failure"] = _rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []

    with FaultyRewardServer("127.0.0.1", 0, revision=REVISION) as restarted:  # a new service, on a new port
        restarted.inject_faults(*TRANSIENT_2)
        facts["resume"] = _resume_cli(run_dir, f'rl.reward.url="{restarted.url}"', *RETRY)
        facts["resume_requests"] = restarted.score_requests
    return facts


def test_sigterm_commits_exits_75_and_exact_resume_equals_the_straight_run(faulty, straight, tmp_path):
    stopped, run_dir = faulty["stopped"], faulty["run_dir"]
    assert faulty["signalled"], "the run ended before it could be preempted: " + stopped.stderr[-3000:]
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    # Only the preemption checkpoint exists (checkpoint.every=0), of step 1, the step that was running.
    assert faulty["committed_at_stop"] == [1]
    assert f"resume {run_dir} --exact" in " ".join(stopped.stderr.split())
    assert [r["step"] for r in faulty["rows_at_stop"]] == [1]
    # The resume from the stop's checkpoint ran step 2 as the straight run did (the step-3 outage
    # then stopped it: the next test), and the run it continued finished equal to the straight run,
    # rows and weights.
    reference = [_deterministic(r) for r in _rows(straight)]
    assert [_deterministic(r) for r in faulty["rows_at_failure"]] == reference[:2]
    assert faulty["resume"].exit_code == 0, faulty["resume"].output[-3000:]
    assert [_deterministic(r) for r in _rows(run_dir)] == reference
    _assert_same_weights(straight, run_dir, STEPS, tmp_path)


def test_transient_reward_faults_are_retried_and_change_nothing(faulty, straight):
    # Steps 1-2 ran through two retried faults; the resumed step 3 through two more.
    assert faulty["rows_at_failure"] and [r["step"] for r in faulty["rows_at_failure"]] == [1, 2], faulty["failed"].stderr[-3000:]
    reference = [_deterministic(r) for r in _rows(straight)]
    assert [_deterministic(r) for r in faulty["rows_at_failure"]] == reference[:2]
    result = faulty["resume"]
    assert result.exit_code == 0, result.output[-3000:]
    assert faulty["resume_requests"] == (STEPS - 2) * RANKS + 2  # the two faults really hit the resumed run
    assert [_deterministic(r) for r in _rows(faulty["run_dir"])] == reference


def test_persistent_reward_faults_stop_with_one_line_naming_the_service_and_resume_point(faulty, straight, tmp_path):
    stderr, run_dir = faulty["failed"].stderr, faulty["run_dir"]
    assert faulty["failed"].returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    failed = [line for line in stderr.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1, stderr[-3000:]
    line = failed[0]
    assert "step 3" in line and "reward service" in line and faulty["url"] in line, line
    assert str(run_dir / "checkpoints" / "step_2") in line and f"cosmos-rl resume {run_dir} --exact" in line, line
    # Step 2, the last completed step, was committed when step 3's rewards failed for good (no
    # periodic checkpoint was due; step 1's is the stop's), and it was exact: the resume from it
    # finished equal to the straight run, weights included.
    assert faulty["committed"] == [1, 2]
    assert faulty["resume"].exit_code == 0, faulty["resume"].output[-3000:]
    _assert_same_weights(straight, run_dir, STEPS, tmp_path)
