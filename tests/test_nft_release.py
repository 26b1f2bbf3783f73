"""NFT as the official release trains: timesteps drawn per sample, a full fine-tune without an old
adapter, the KL measured (never reported unmeasured) at the logging cadence with kl_beta = 0, and
train/advantage_abs_mean. The smoke manifest's steps, in one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_rl.config import load

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "nft_t2i_smoke.toml"
FAST = ["rl.sample_steps=4", "rl.timesteps_per_sample=2", "job.progress=false", "rl.sample_grid_every=0",
        "checkpoint.every=0", "checkpoint.keep=0"]  # fmt: skip


def _run(tmp_path: Path, *extra: str) -> list[dict]:
    from _nft_local import run_local

    config = load.load(SMOKE, [*FAST, f'job.output_dir="{tmp_path}"', 'job.name="r"', *extra])
    return run_local(config, tmp_path / "r")


def test_kl_is_measured_on_logged_steps_only_and_advantage_abs_mean_is_logged(tmp_path):
    """kl_beta = 0, log_every = 2: the step-2 row carries a KL that was computed (the policy has
    moved off the reference after one update, so it is > 0; an unmeasured KL used to read 0)."""
    rows = _run(tmp_path, "rl.max_steps=2", "job.log_every=2")
    assert [r["step"] for r in rows] == [2]
    (row,) = rows
    assert row["train/kl_loss"] > 0
    assert abs(row["train/advantage_mean"]) <= row["train/advantage_abs_mean"] <= 5.0
    assert row["train/advantage_abs_mean"] > 0


def test_a_full_fine_tune_trains_without_an_old_adapter_and_is_evaluated_against_its_frozen_base(tmp_path):
    from cosmos_rl.commands.evaluate import run_eval

    extra = ["rl.max_steps=2", "model.lora.rank=0", "rl.old.build_old=false", "rl.kl_beta=0.1"]
    rows = _run(tmp_path, *extra)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["train/kl_loss"] == 0.0  # step 1 trains the base itself: the frozen copy is equal
    assert rows[1]["train/kl_loss"] > 0 and rows[1]["train/grad_norm"] > 0
    config = load.load(SMOKE, [*FAST, f'job.output_dir="{tmp_path}"', 'job.name="r"', *extra])
    (tmp_path / "r" / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    result = run_eval(str(tmp_path / "r"), reward="brightness", per_task=1, seeds=1)
    assert result["step"] == 2 and result["base_score"] != result["score"]


def test_the_velocity_space_error_is_still_offered(tmp_path):
    """x0_weighting is on by default (the release's choice); off changes the loss."""
    on = _run(tmp_path / "on", "rl.max_steps=1")
    off = _run(tmp_path / "off", "rl.max_steps=1", "rl.x0_weighting=false")
    assert on[0]["train/reward_mean"] == off[0]["train/reward_mean"]  # the same rollout
    assert on[0]["train/policy_loss"] != pytest.approx(off[0]["train/policy_loss"])
