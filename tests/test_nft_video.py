"""DiffusionNFT on video (docs/video.md "NFT on video"): clips through the online step, in this
process (tests/_nft_local.py plays both ranks) and end to end on the session's Ray cluster.

Tiny sizes: the shapes base with its image VAE (every frame its own latent frame), 5 frames at
32x32, a group of 2, one prompt row, 2-3 sampler steps, one training timestep per clip. The rewards
include brightness scored frame by frame (an image reward on clips, as the client scores one),
because the image base's clips all score 0 with the video verifier (measured: 0 for all 32 clips of
the manifest's first two steps): rewards that vary within a group are what make a step train.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from cosmos_rl.config import load

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "nft_video_shapes_cpu.toml"
FRAMES = 5
TINY = [
    f"model.num_frames={FRAMES}", "rl.group_size=2", "rl.prompts_per_step=1", "rl.timesteps_per_sample=1",
    "job.progress=false", "job.log_every=1", "checkpoint.keep=0",
]
BRIGHTNESS = ['rl.reward.name="brightness"']
# On Ray: the clip reward through the built-in service (whole clips; the driver's check that the
# run's rewards take clips) beside brightness frame by frame, whose spread makes the steps train.
# The Ray run is image-to-video (docs/video.md "Conditioning: image to video"): the text-to-video step with the
# condition added, so one pair of Ray runs covers both; its clip reward is the I2V one.
BOTH = ["rl.reward={}", 'rl.rewards=[{name="brightness", revision="builtin-v1"}, {name="shapes_video_i2v_partial", revision="builtin-v1"}]',
        'model.condition.kind="first_frame"', 'model.condition.source="shapes_video"']


def _config(tmp_path: Path, *extra: str):
    prompts = f'rl.prompts.file="{REPO / "manifests" / "shapes_video_train.txt"}"'
    return load.load(MANIFEST, [*TINY, prompts, f'job.output_dir="{tmp_path}"', *extra])


def test_one_video_nft_step_rolls_out_clips_scores_them_per_frame_and_trains(tmp_path):
    from _nft_local import local_trainer

    config = _config(tmp_path, *BRIGHTNESS, "rl.sample_steps=2", "rl.max_steps=1", "rl.eval.every=0", "rl.sample_grid_every=1")
    trainer = local_trainer(config, tmp_path / "run")
    assert trainer.build(resume=False) == 0
    seen = []
    rollout = trainer.rollout
    trainer.rollout = lambda *a: seen.append(rollout(*a)) or seen[-1]
    metrics = trainer.train_step(1)

    (x0_a, sigmas, pixels_a), (x0_b, _, pixels_b) = seen[0]
    # the video base's VAE: 4 latent channels, 2x in time (5 frames -> 1 + 4 / 2 = 3), 4x in space (32 -> 8)
    assert x0_a.shape == (1, 4, 3, 8, 8)
    assert pixels_a.shape == (1, FRAMES, 32, 32, 3) and pixels_a.dtype == torch.uint8
    assert len(sigmas) == 2  # the sampler's two timesteps, which NFT trains at
    assert not torch.equal(x0_a, x0_b)  # each rank's clip from its own noise
    # brightness per frame, mean over the clip's frames = the clip's pixel mean / 255
    expected = [float(p.numpy().astype(np.float64).mean()) / 255.0 for p in (pixels_a, pixels_b)]
    assert metrics["train/reward_mean"] == pytest.approx(float(np.mean(expected)), rel=1e-9)
    assert metrics["train/reward_std"] == pytest.approx(float(np.std(expected)), rel=1e-6) and metrics["train/reward_std"] > 0
    # rewards that differ in the group: non-zero advantages, a real gradient step
    assert metrics["train/advantage_abs_mean"] > 0 and metrics["train/grad_norm"] > 0
    assert (tmp_path / "run" / "samples" / "step_1.png").is_file() and (tmp_path / "run" / "samples" / "step_1.gif").is_file()


def test_video_nft_trains_at_the_time_positions_it_samples_at(tmp_path, monkeypatch):
    """Every forward of a step, rollout and training alike, places the clip's latent frames with the
    run's fps and the VAE's temporal factor (here fps 16 against the transformer's base_fps 24)."""
    from _nft_local import local_trainer

    from cosmos_rl.models import packing

    config = _config(tmp_path, *BRIGHTNESS, "model.fps=16", "rl.sample_steps=2", "rl.max_steps=1", "rl.eval.every=0")
    trainer = local_trainer(config, tmp_path / "run")
    assert trainer.build(resume=False) == 0
    calls, real = [], packing.velocity
    monkeypatch.setattr(packing, "velocity", lambda *a, **kw: calls.append((torch.is_grad_enabled(), kw)) or real(*a, **kw))
    trainer.train_step(1)
    assert any(grad for grad, _ in calls), "the policy's training forward went through packing.velocity"
    assert calls and all((kw.get("fps"), kw.get("temporal_factor")) == (16.0, 2) for _, kw in calls), calls


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _policy_tensors(run_dir: Path, step: int, tmp: Path) -> dict[str, torch.Tensor]:
    from test_nft_ray import _checkpoint_tensors

    return {k: v for k, v in _checkpoint_tensors(run_dir, step, tmp).items() if k.startswith(("policy.", "old.", "optimizer."))}


def _sigterm_after_first_row(run_dir: Path) -> threading.Thread:
    """A watcher that sends this process SIGTERM once the run has logged its first step, as a
    scheduler would: the driver (in this process, its stop handler installed) finishes the step it
    is in, commits and raises Preempted (the command's exit 75)."""

    def watch():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            path = run_dir / "metrics.jsonl"
            if path.exists() and path.read_text().strip():
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_video_nft_on_ray_stopped_by_sigterm_resumes_exactly(ray_cluster, tmp_path):
    """Three steps of image-to-video NFT on two Ray actors (rollouts conditioned on the world's first
    frames; the built-in reward services: the video verifier's I2V score on whole clips and
    brightness frame by frame; [rl.eval] image-to-video with the video verifier at step 2),
    straight, and stopped by SIGTERM after its first step then resumed with --exact: the same
    metrics rows and bit-equal weights."""
    from cosmos_rl.commands import launch
    from cosmos_rl.core.errors import Preempted

    fast = [*BOTH, "rl.sample_steps=3", "checkpoint.every=1", "rl.sample_grid_every=2",
            "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", "rl.eval.sample_steps=2", "rl.max_steps=3"]  # fmt: skip

    def train(name: str) -> int:
        config = _config(tmp_path, *fast, f'job.name="{name}"')
        return launch.train(config, MANIFEST, Console(stderr=True))

    assert train("straight") == 0
    straight, split = tmp_path / "straight", tmp_path / "split"
    watcher = _sigterm_after_first_row(split)
    with pytest.raises(Preempted):  # stopped after committing its step: exit 75, then resume --exact
        train("split")
    watcher.join(timeout=5)
    stopped_at = [r["step"] for r in _rows(split)]
    assert stopped_at in ([1], [1, 2]), stopped_at
    assert launch.resume(split, [], exact=True, console=Console(stderr=True)) == 0

    a_rows, b_rows = _rows(straight), _rows(split)
    strip = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}  # noqa: E731
    assert [strip(r) for r in a_rows] == [strip(r) for r in b_rows]
    assert [r["step"] for r in a_rows] == [1, 2, 3] and all(r["train/grad_norm"] > 0 for r in a_rows)
    assert all(0.0 <= r["train/shapes_video_i2v_partial/reward_mean"] <= 1.0 for r in a_rows)
    assert "eval/score" in a_rows[1] and 0.0 <= a_rows[1]["eval/score"] <= 1.0
    a, b = _policy_tensors(straight, 3, tmp_path), _policy_tensors(split, 3, tmp_path)
    assert a and set(a) == set(b) and any(k.startswith("old.") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert (straight / "samples" / "step_2.gif").is_file()


def test_plan_counts_the_training_forwards_clips_per_rank():
    """plan's train_activation_mib_per_rank: rows x K clips of the per-sample estimate (docs/video.md).
    Video base (hidden 128, MLP 256, 4 layers, patch 2; VAE 4x in space, 2x in time): a 9-frame
    32x32 clip is 5 latent frames x 4 x 4 = 80 tokens, 4 x 80 x (12 x 128 + 4 x 256) x 4 bytes =
    3.125 MiB; 5 frames are 3 latent frames, 48 tokens, 1.875 MiB."""
    from cosmos_rl.planning import plan

    def per_rank(*extra):
        return plan.build(load.load(MANIFEST, list(extra)), str(MANIFEST))["per_step"]["train_activation_mib_per_rank"]

    assert per_rank() == 3.125 * 8 * 4  # the manifest: 8 rows x timesteps_per_sample 4
    assert per_rank("rl.timesteps_per_sample=1") == 3.125 * 8
    assert per_rank("model.num_frames=5") == pytest.approx(1.875 * 32, abs=0.005)  # linear in latent frames
    # checkpointing keeps 4 layer inputs (4 x 80 x 128 x 4 bytes) + one layer's 80 x 2560 x 4 bytes
    assert per_rank("model.gradient_checkpointing=true") == pytest.approx((4 * 80 * 128 * 4 + 80 * 2560 * 4) * 32 / 2**20, abs=0.005)


def test_the_shipped_video_training_prompts_are_what_the_documented_command_writes(tmp_path):
    """manifests/shapes_video_train.txt = `python -m cosmos_rl.shapes video-prompts DIR --seed 0
    --balanced 1200`, and none of its rows is one of the held-out prompts that command writes."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "cosmos_rl.shapes", "video-prompts", str(tmp_path), "--seed", "0", "--balanced", "1200"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shipped = (REPO / "manifests" / "shapes_video_train.txt").read_text()
    assert (tmp_path / "train.txt").read_text() == shipped
    held_out = {json.loads(line)["prompt"] for line in (tmp_path / "held_out.jsonl").read_text().splitlines() if line.strip()}
    assert len(held_out) == 319 and not held_out & set(shipped.splitlines())


def test_the_per_frame_training_prompts_are_the_shipped_ones_an_image_verifier_can_score():
    """manifests/shapes_video_train_per_frame.txt (NFT on the shapes image verifier frame by frame)
    = manifests/shapes_video_train.txt without its colour changes, the rows with no static part, in
    order: 1,200 balanced rows less the 200 of one task of six."""
    from cosmos_rl.shapes import frame_captions

    rows = (REPO / "manifests" / "shapes_video_train.txt").read_text().splitlines()
    kept = [row for row, still in zip(rows, frame_captions(rows)) if still is not None]
    assert len(rows) == 1200 and len(kept) == 1000
    assert (REPO / "manifests" / "shapes_video_train_per_frame.txt").read_text().splitlines() == kept


def test_the_four_task_training_prompts_are_the_shipped_ones_without_static_or_two_motions():
    """manifests/shapes_video_train_four_tasks.txt (the video NFT manifest's prompts) =
    manifests/shapes_video_train.txt without its `static` and `two_motions` rows, in order: 1,200
    balanced rows less the 200 of each of those two tasks, 200 of each of the other four."""
    from collections import Counter

    from cosmos_rl.shapes.motion_caption import parse_motion_caption

    rows = (REPO / "manifests" / "shapes_video_train.txt").read_text().splitlines()
    kept = [row for row in rows if parse_motion_caption(row).task not in ("static", "two_motions")]
    assert Counter(parse_motion_caption(row).task for row in kept) == {
        "motion": 200, "colour_change": 200, "counting_motion": 200, "turn": 200,
    }  # fmt: skip
    assert (REPO / "manifests" / "shapes_video_train_four_tasks.txt").read_text().splitlines() == kept


def test_plan_says_a_clip_runs_rewards_score_clips():
    """plan's roles name what the reward services receive: clips for a clip run, images for an image run."""
    from cosmos_rl.config import load
    from cosmos_rl.planning import plan

    roles = plan.build(load.load(MANIFEST, []), str(MANIFEST))["roles"]
    assert "own clips to the reward services" in roles["reward"] and "images" not in roles["reward"]
    image = MANIFEST.parent / "nft_shapes_cpu.toml"
    assert "own images to the reward services" in plan.build(load.load(image, []), str(image))["roles"]["reward"]
