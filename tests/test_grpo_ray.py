"""Flow-GRPO end to end on the session's local Ray cluster: two real actors forming one FSDP2
world, a real reward service on loopback, real DCP checkpoints; and a run preempted by SIGTERM
in its first step, resumed with --exact, equal to the straight run.

A group of 2 samples, so 2 actors (each one's start imports the stack, three starts per leg
saved): GRPO's group statistics still gather across ranks, and a four-rank GRPO world (2 samples
x 2 context ranks, against one process) is tests/test_nft_context_parallel.py's.

Two steps of plain Flow-GRPO on the tiny model (3 sampler steps, 2 of them trained, KL weighed,
the policy's moving average kept every step).
The preempted run is `cosmos-rl train` through the real CLI in this process (tests/_inproc.py: its
exit code and stderr without a second import of the stack), scoring at a reward service this test
hosts: its first /score request says step 1 is under way, which is when the SIGTERM goes (after
step 1 the run would already be finishing its last step).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
from rich.console import Console

from cosmos_rl.commands import launch
from cosmos_rl.config import load
from cosmos_rl.rewards.server import RewardServer
from cosmos_rl.trainers.grpo import METRIC_NAMES

from _inproc import cosmos, stop_self_when, stop_watch
from test_nft_faults import _committed, _resume_cli
from test_nft_ray import _checkpoint_tensors, _deterministic, _rows

pytestmark = pytest.mark.slow

STEPS = 2
REVISION = "builtin-v1"


def _manifest(root: Path, name: str, **reward) -> Path:
    raw = {
        "job": {"name": name, "output_dir": str(root), "seed": 0, "progress": False},
        "model": {"preset": "tiny", "image_size": 32, "lora": {"rank": 4, "alpha": 8.0}},
        "grid": {"backend": "ray", "device": "cpu"},
        "rl": {
            "algorithm": "grpo", "init_from": "preset:tiny", "max_steps": STEPS, "group_size": 2,
            "prompts_per_step": 1, "sample_steps": 3, "guidance": 1.0, "kl_beta": 0.04, "sample_grid_every": 0,
            "ema_decay": 0.5, "ema_every": 1,  # the moving average is checkpointed and resumes exactly too
            "optimizer": {"lr": 1e-2}, "reward": {"name": "brightness", "revision": REVISION, **reward},
        },
        "checkpoint": {"every": 100, "keep": 0},  # only the last step's, or the preemption's
    }  # fmt: skip
    path = root / f"{name}.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def test_two_grpo_steps_on_two_actors_and_a_sigterm_resume_equal_the_straight_run(ray_cluster, tmp_path):
    straight_manifest = _manifest(tmp_path, "straight")
    assert launch.train(load.load(straight_manifest), straight_manifest, Console(stderr=True)) == 0
    straight = tmp_path / "straight"
    rows = _rows(straight)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        missing = [name for name in METRIC_NAMES if name not in row]
        assert not missing, f"step {row['step']} lacks {missing}"
        assert 0.0 <= row["train/reward_mean"] <= 1.0
        # On-policy: each rank's training forward gives back the log-prob its rollout recorded.
        assert row["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and row["train/clip_fraction"] == 0.0
    # LoRA starts at B = 0, so at step 1 the policy is the reference; step 2's has moved off it.
    assert rows[0]["train/kl"] == 0.0 < rows[1]["train/kl"]

    with RewardServer("127.0.0.1", 0, revision=REVISION) as server:
        manifest = _manifest(tmp_path, "pre", url=server.url)
        run_dir = tmp_path / "pre"
        watcher = stop_self_when(lambda: server.score_requests > 0)
        stopped = cosmos("train", manifest)
        assert stop_watch(watcher), "the run ended before it could be preempted: " + stopped.stderr[-3000:]
        assert stopped.returncode == 75, stopped.stderr[-3000:]
        assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
        assert _committed(run_dir) == [1]
        assert f"resume {run_dir} --exact" in " ".join(stopped.stderr.split())

        result = _resume_cli(run_dir)
        assert result.exit_code == 0, result.output[-3000:]
    assert [_deterministic(r) for r in _rows(run_dir)] == [_deterministic(r) for r in rows]
    a, b = _checkpoint_tensors(straight, STEPS, tmp_path), _checkpoint_tensors(run_dir, STEPS, tmp_path)
    weights = [k for k in a if k.startswith(("policy.", "ema.", "optimizer."))]
    assert any(k.startswith("optimizer.") for k in weights) and any(k.startswith("ema.") for k in weights) and set(a) == set(b)
    assert not any(k.startswith("old.") for k in a)  # on-policy: no old adapter is kept
    for key in weights:
        assert a[key].equal(b[key]), key
