"""The shared step loop with stand-in steps: cadence, metrics rows, held-out passes, preemption, non-finite stops."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cosmos_rl.planning import plan
from cosmos_rl.config import load
from cosmos_rl.core.errors import Preempted, RunFailed
from cosmos_rl.trainers.loop import LoopSpec, run_steps

SMOKE = Path(__file__).resolve().parents[1] / "manifests" / "dpo_t2i_smoke.toml"


def _config(tmp_path, *overrides):
    return load.load(SMOKE, [f'job.output_dir="{tmp_path}"', "job.progress=false", *overrides])


def _spec(run_dir, start=0, resumed=False):
    run_dir.mkdir(parents=True, exist_ok=True)
    return LoopSpec(run_dir=run_dir, start_step=start, resumed=resumed, main=True, unit="pairs",
                    items_per_step=1, progress_fields=("train/loss",))


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_steps_rows_saves_and_holdout_follow_the_config(tmp_path):
    """max 5, log_every 2, checkpoint.every 2: rows at 2, 4 and the last (5); saves at 2, 4, 5;
    the held-out pass runs after the steps it names and its values land in that row."""
    config = _config(tmp_path, "rl.max_steps=5", "job.log_every=2", "checkpoint.every=2")
    saved, stepped = [], []

    def step_fn(step):
        stepped.append(step)
        return {"train/loss": float(step), "train/grad_norm": 1.0}

    def holdout(step):
        return {"val/loss": 10.0 * step} if step % 4 == 0 else {}

    rows = run_steps(config, _spec(tmp_path / "run"), step_fn, saved.append, lambda: None, holdout)
    assert stepped == [1, 2, 3, 4, 5]
    assert saved == [2, 4, 5]
    assert [r["step"] for r in rows] == [2, 4, 5] == [r["step"] for r in _rows(tmp_path / "run")]
    assert rows[1]["val/loss"] == 40.0 and "val/loss" not in rows[0]


def test_a_stop_request_commits_the_step_and_raises_preempted(tmp_path):
    config = _config(tmp_path, "rl.max_steps=10", "checkpoint.every=4")
    saved = []
    asked = iter([None, None, "SIGTERM"])
    with pytest.raises(Preempted, match=r"stopped by SIGTERM after committing step 3; .*resume .*--exact"):
        run_steps(config, _spec(tmp_path / "run"), lambda s: {"train/loss": 0.5}, saved.append, lambda: next(asked))
    assert saved == [3]  # step 3 was not a cadence step: saved because of the stop


def test_a_stop_on_a_cadence_step_saves_once(tmp_path):
    config = _config(tmp_path, "rl.max_steps=10", "checkpoint.every=2")
    saved = []
    asked = iter([None, "SIGUSR1"])
    with pytest.raises(Preempted):
        run_steps(config, _spec(tmp_path / "run"), lambda s: {"train/loss": 0.5}, saved.append, lambda: next(asked))
    assert saved == [2]


def test_a_non_finite_loss_stops_before_anything_is_written_for_that_step(tmp_path):
    config = _config(tmp_path, "rl.max_steps=5", "checkpoint.every=1")
    saved = []
    losses = iter([0.5, math.nan])
    with pytest.raises(RunFailed, match=r"step 2: non-finite \{'train/loss': nan\}"):
        run_steps(config, _spec(tmp_path / "run"), lambda s: {"train/loss": next(losses)}, saved.append, lambda: None)
    assert saved == [1]
    assert [r["step"] for r in _rows(tmp_path / "run")] == [1]


def test_a_resumed_loop_starts_after_its_checkpoint_and_drops_later_rows(tmp_path):
    config = _config(tmp_path, "rl.max_steps=4", "checkpoint.every=0")
    run_dir = tmp_path / "run"
    run_steps(config, _spec(run_dir), lambda s: {"train/loss": float(s)}, lambda s: None, lambda: None)
    stepped = []
    run_steps(config, _spec(run_dir, start=2, resumed=True), lambda s: stepped.append(s) or {"train/loss": -float(s)},
              lambda s: None, lambda: None)
    assert stepped == [3, 4]
    assert [(r["step"], r["train/loss"]) for r in _rows(run_dir)] == [(1, 1.0), (2, 2.0), (3, -3.0), (4, -4.0)]


def test_a_knob_added_later_leaves_the_identity_alone_at_its_default():
    """rl.x0_weighting came after checkpoint format 1, off; its default is now on (the official
    release's choice). A run directory's saved manifest without the key (written before it existed)
    loads it off, as that run computed, with the identity it always had; a new manifest without
    the key gets today's default, which is part of the identity."""
    nft = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"
    assert "x0_weighting" not in nft.read_text()
    saved, fresh = load.load(nft, saved_run=True), load.load(nft)
    assert saved.rl.x0_weighting is False and fresh.rl.x0_weighting is True
    assert "rl.x0_weighting" not in plan.identity_fields(saved)
    assert plan.identity_fields(fresh)["rl.x0_weighting"] is True
    assert plan.run_identity(saved) != plan.run_identity(fresh)
    assert load.load(nft, ["rl.x0_weighting=true"], saved_run=True).rl.x0_weighting is True


def test_a_rows_time_metrics_are_the_mean_over_the_steps_it_covers(tmp_path):
    """log_every 3 over 7 steps: rows at 3, 6, 7. time/x is the step number, so the rows read
    (1+2+3)/3 = 2, (4+5+6)/3 = 5 and 7; time/y comes only on even steps, so its means are over
    those: 2, (4+6)/2 = 5, and none in the last row. Other keys are the logged step's own."""
    config = _config(tmp_path, "rl.max_steps=7", "job.log_every=3", "checkpoint.every=0")

    def step_fn(step):
        row = {"train/loss": float(step), "time/x": float(step)}
        if step % 2 == 0:
            row["time/y"] = float(step)
        return row

    rows = run_steps(config, _spec(tmp_path / "run"), step_fn, lambda s: None, lambda: None)
    assert [(r["step"], r["train/loss"], r["time/x"], r.get("time/y")) for r in rows] == [
        (3, 3.0, 2.0, 2.0), (6, 6.0, 5.0, 5.0), (7, 7.0, 7.0, None)]
    assert [r["time/x"] for r in _rows(tmp_path / "run")] == [2.0, 5.0, 7.0]


def test_a_loop_writing_to_a_log_prints_a_line_per_logged_step_and_the_same_rows(tmp_path, capsys):
    """stdout not a terminal (captured): a plain line at every job.log_every-th step and the last;
    the metrics rows are those of a run with progress off."""
    def step_fn(step):
        return {"train/loss": 1.0 / step, "train/grad_norm": 1.0}

    rows = {}
    for progress in ("true", "false"):
        config = _config(tmp_path, "rl.max_steps=5", "job.log_every=2", f"job.progress={progress}", f'job.name="p{progress}"')
        run_steps(config, _spec(tmp_path / progress), step_fn, lambda s: None, lambda: None)
        rows[progress] = _rows(tmp_path / progress)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["0/5:", "2/5", "4/5", "5/5"]
    assert "train/loss 0.25" in lines[2] and "eta" in lines[2]
    assert rows["true"] == rows["false"]


def test_the_progress_cadence_is_checked_and_is_not_part_of_the_run_identity():
    _, problems = load.load_all_problems(SMOKE, ["job.progress_every_s=0"])
    assert [p.render() for p in problems if p.path == "job.progress_every_s"] == [
        "job.progress_every_s: must be > 0 (got 0.0); set job.progress_every_s to a positive number"]
    assert plan.run_identity(load.load(SMOKE, ["job.progress_every_s=5.0"])) == plan.run_identity(load.load(SMOKE))
