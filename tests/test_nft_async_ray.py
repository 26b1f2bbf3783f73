"""One-step-off scoring (rl.async_reward) end to end on the session's Ray cluster: `cosmos-rl train`
(the real CLI in this process, tests/_inproc.py) gets SIGTERM after its first metrics row, commits
(the checkpoint holds each rank's pending rollout) and exits 75; `cosmos-rl resume RUN --exact`
finishes equal to an uninterrupted async run (metrics rows minus time/*, final weights). The
helpers are test_nft_faults.py's."""

from __future__ import annotations

import pytest
from rich.console import Console

from cosmos_rl.commands import launch
from cosmos_rl.config import load

from _inproc import cosmos, stop_self_when, stop_watch
from test_nft_faults import STEPS, _assert_same_weights, _committed, _overrides, _resume_cli
from test_nft_ray import SMOKE, _deterministic, _rows

pytestmark = pytest.mark.slow

ASYNC = "rl.async_reward=true"


def test_sigterm_mid_run_commits_the_pending_rollout_and_exact_resume_equals_the_straight_async_run(ray_cluster, tmp_path):
    straight = tmp_path / "straight"
    assert launch.train(load.load(SMOKE, _overrides(tmp_path, "straight", "checkpoint.every=100", ASYNC)), SMOKE, Console(stderr=True)) == 0

    run_dir = tmp_path / "pre"
    metrics = run_dir / "metrics.jsonl"
    watcher = stop_self_when(lambda: metrics.exists() and bool(metrics.read_text().strip()))
    stopped = cosmos("train", SMOKE, *_overrides(tmp_path, "pre", "checkpoint.every=100", ASYNC))
    assert stop_watch(watcher), "the run ended before it could be preempted: " + stopped.stderr[-3000:]
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    committed = _committed(run_dir)
    assert len(committed) == 1 and 1 <= committed[0] < STEPS, committed
    meta = (run_dir / "checkpoints" / f"step_{committed[0]}" / "meta.json").read_text()
    assert '"pending_rollout"' in meta  # the next step's rollout, made before this step's learn

    result = _resume_cli(run_dir)
    assert result.exit_code == 0, result.output[-3000:]
    assert [_deterministic(r) for r in _rows(run_dir)] == [_deterministic(r) for r in _rows(straight)]
    _assert_same_weights(straight, run_dir, STEPS, tmp_path)
