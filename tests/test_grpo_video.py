"""Flow-GRPO on clips (docs/grpo.md "GRPO on clips"): text to video, image to video, a clip
continued and forward dynamics through the GRPO step in this process (tests/_nft_local.py plays
both ranks), and image to video end to end on the session's Ray cluster with two rewards, stopped
by SIGTERM and resumed with --exact equal to the straight run. Text to video on Ray is
tests/test_nft_context_parallel.py's GRPO run (2 samples x 2 context ranks, against one process).

Tiny sizes: the shapes_video base (its VAE halves time: 5 frames are 3 latent frames, 9 are 5),
32x32, a group of 2, one prompt row, 3 sampler steps with a fast window of one stochastic step.
Brightness scored frame by frame is the reward wherever a step must train: its spread within a
group makes the advantages non-zero (the video verifier scores the untrained base's clips 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rich.console import Console

from cosmos_rl.config import load, preflight

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "grpo_video_shapes_cpu.toml"
TINY = [
    "model.num_frames=5", "rl.group_size=2", "rl.prompts_per_step=1", "rl.sample_steps=3", "rl.sde_window=1",
    "rl.sde_window_range=[]", "rl.ema_every=1", "job.progress=false", "job.log_every=1", "checkpoint.keep=0",
    "rl.eval.every=0", "rl.sample_grid_every=0", "rl.max_steps=2",
]  # fmt: skip
BRIGHTNESS = ['rl.reward.name="brightness"']
I2V = ['model.condition.kind="first_frame"', 'model.condition.source="shapes_video"']


def _config(tmp_path: Path, *extra: str):
    prompts = f'rl.prompts.file="{REPO / "manifests" / "shapes_video_train.txt"}"'
    config = load.load(MANIFEST, [*TINY, prompts, f'job.output_dir="{tmp_path}"', *extra])
    assert [p.render() for p in preflight.check(config, MANIFEST.parent) if p.severity == "error"] == []
    return config


def _watch(trainer, monkeypatch):
    """Spies on one step: the rollouts (condition, per-rank rollouts), the SDE records, and every
    packed forward (its keywords, and the gradient reaching its velocity output when it has one)."""
    from cosmos_rl.models import packing

    seen, forwards, grads = [], [], []
    rollout = trainer.rollout
    trainer.rollout = lambda *a, **kw: seen.append((a[-1] if len(a) > 3 else None, rollout(*a, **kw))) or seen[-1][1]
    learn, records = trainer.learn, []

    def keep(*args, **kwargs):
        records.append({rank: trainer.replay[rank][1] for rank in trainer.comm.ranks})
        return learn(*args, **kwargs)

    trainer.learn = keep
    real = packing.velocity

    def velocity(*args, **kwargs):
        out = real(*args, **kwargs)
        forwards.append(kwargs)
        frames = out[0] if isinstance(out, tuple) else out
        if torch.is_grad_enabled() and frames.requires_grad:  # the policy's training forward
            frames.register_hook(lambda g: grads.append(g.detach().clone()))
        return out

    monkeypatch.setattr(packing, "velocity", velocity)
    return seen, records, forwards, grads


def test_one_text_to_video_grpo_step_moves_every_latent_frame_at_the_clips_time_positions(tmp_path, monkeypatch):
    from _nft_local import local_trainer

    trainer = local_trainer(_config(tmp_path, *BRIGHTNESS, "model.fps=16"), tmp_path / "run")
    assert trainer.build(resume=False) == 0
    seen, records, forwards, grads = _watch(trainer, monkeypatch)
    metrics = trainer.train_step(1)

    (condition, ((x0_a, sigmas, pixels_a), (x0_b, _, _))), = seen
    assert condition is None and x0_a.shape == (1, 4, 3, 8, 8) and len(sigmas) == 3
    assert pixels_a.shape == (1, 5, 32, 32, 3) and pixels_a.dtype == torch.uint8
    assert not torch.equal(x0_a, x0_b)
    for rank_records in records[0].values():
        (record,) = rank_records  # a window of one stochastic step
        assert record.clean_frames == 0
        # the step's noise moved every latent frame: x_next - mean = std * xi, non-zero on each frame
        taken = (record.x_next - record.mean).abs().flatten(3).amax(dim=(0, 1, 3))
        assert taken.shape == (3,) and bool((taken > 0).all())
    # every forward, rollout and training, at fps 16 (against the base rate) and the VAE's factor 2
    assert forwards and all((kw.get("fps"), kw.get("temporal_factor"), kw.get("clean_frames")) == (16.0, 2, 0) for kw in forwards)
    assert grads and all(bool((g.abs().flatten(3).amax(dim=(0, 1, 3)) > 0).all()) for g in grads)  # every frame trains
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and metrics["train/clip_fraction"] == 0.0
    assert metrics["train/advantage_abs_mean"] > 0 and metrics["train/grad_norm"] > 0


@pytest.mark.parametrize(
    "kind, frames, clean",
    [("first_frame", 5, 1), ("standin_conditions:FIRST_FIVE", 9, 3)],  # image to video; a 9-frame clip continued from its first five
    ids=["image-to-video", "continuation"],
)
def test_a_conditioned_grpo_step_holds_the_given_frames_and_trains_only_the_rest(tmp_path, monkeypatch, kind, frames, clean):
    from _nft_local import local_trainer

    from cosmos_rl.algorithms.grpo import step_log_prob

    config = _config(tmp_path, *BRIGHTNESS, f'model.condition.kind="{kind}"', 'model.condition.source="shapes_video"', f"model.num_frames={frames}")
    trainer = local_trainer(config, tmp_path / "run")
    assert trainer.build(resume=False) == 0
    seen, records, forwards, grads = _watch(trainer, monkeypatch)
    metrics = trainer.train_step(1)

    (condition, rollouts), = seen
    assert condition.shape == (1, 4, clean, 8, 8)
    for x0, _, _ in rollouts:  # every rank's clip keeps the given latent frames exactly
        assert torch.equal(x0[:, :, :clean], condition)
    assert not torch.equal(rollouts[0][0][:, :, clean:], rollouts[1][0][:, :, clean:])
    for rank_records in records[0].values():
        for r in rank_records:
            assert r.clean_frames == clean
            assert torch.equal(r.x[:, :, :clean], condition) and torch.equal(r.x_next[:, :, :clean], condition)
            # the recorded (old) log-prob is the generated frames' alone
            assert torch.equal(r.log_prob, step_log_prob(r.x_next[:, :, clean:], r.mean[:, :, clean:], r.std))
    # every forward is told the given frames are clean; no gradient reaches their velocity, all the others train
    assert forwards and all(kw.get("clean_frames") == clean for kw in forwards)
    assert grads and all(not g[:, :, :clean].any() and bool((g[:, :, clean:].abs().flatten(3).amax(dim=(0, 1, 3)) > 0).all()) for g in grads)
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/advantage_abs_mean"] > 0 and metrics["train/grad_norm"] > 0


def test_a_forward_dynamics_grpo_step_holds_frame_0_and_the_action_rows_out_of_the_objective(tmp_path, monkeypatch):
    """The world model (docs/world.md): rows are Push-T window keys; every forward, in both guidance
    branches, carries the rows' true action rows clean; latent frame 0 and the action velocity get
    no gradient. (Brightness, not the Push-T verifier, is the reward: the untrained folder's clips
    tie under the verifier, and a tied group trains nothing.)"""
    from _nft_local import local_trainer
    from _video_folders import world_nano_folder
    from test_nft_world import KEYS

    folder = world_nano_folder(tmp_path / "pipe", seed=3)
    text = (REPO / "manifests" / "grpo_shapes_cpu.toml").read_text()
    world = (f'[model]\npath = "{folder}"\ndtype = "float32"\nheight = 32\nwidth = 32\nnum_frames = 5\nfps = 10.0\n\n'
             '[model.condition]\nkind = "forward_dynamics"\nsource = "pusht"\n\n[model.action]\nembodiment = "pusht"\n'
             'offset = [256.0, 256.0]\nscale = [256.0, 256.0]\n')  # fmt: skip
    manifest = tmp_path / "grpo_world.toml"
    manifest.write_text(text.replace('[model]\npreset = "shapes"\nimage_size = 32\n', world))
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    config = load.load(manifest, [
        f'rl.init_from="{folder}"', f'rl.prompts.file="{keys}"', 'rl.reward.name="brightness"', "rl.eval.every=0",
        "rl.group_size=2", "rl.prompts_per_step=2", "rl.sample_steps=3", "rl.sde_window=1", "rl.sde_window_range=[]", "rl.guidance=2.0",
        "rl.max_steps=1", "rl.sample_grid_every=0", "job.progress=false", "checkpoint.keep=0", "model.lora.rank=4", "model.lora.alpha=8.0",
        f'job.output_dir="{tmp_path}"',
    ])  # fmt: skip
    assert [p.render() for p in preflight.check(config, manifest.parent) if p.severity == "error"] == []
    trainer = local_trainer(config, tmp_path / "run")
    assert trainer.build(resume=False) == 0
    seen, records, forwards, grads = _watch(trainer, monkeypatch)
    metrics = trainer.train_step(1)

    (_, rollouts), = seen
    for rank_records in records[0].values():
        for r in rank_records:
            assert r.clean_frames == 1 and torch.equal(r.x_next[:, :, :1], rollouts[0][0][:, :, :1])
    # guidance 2: both branches in one forward of 2 x 2 rows, each beside its row's clean action rows
    assert forwards and all(kw.get("actions") is not None and kw.get("clean_frames") == 1 for kw in forwards)
    assert all(kw["actions"].shape[0] == 4 and kw["action_layout"].clean_rows == (4,) * 4 for kw in forwards)
    assert all(torch.equal(kw["actions"][:2], kw["actions"][2:]) for kw in forwards)  # the uncond branch's are the cond branch's
    assert grads and all(not g[:, :, :1].any() and g[:, :, 1:].abs().sum() > 0 for g in grads)
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/advantage_abs_mean"] > 0 and metrics["train/grad_norm"] > 0


# ------------------------------------------------------------------------------------ on Ray
def _rows(run_dir: Path) -> list[dict]:
    from test_nft_video import _rows as rows

    return rows(run_dir)


def _sigterm_at_first_score(server):
    """A watcher that sends this process SIGTERM once `server` sees its first /score request, i.e.
    in step 1: the driver (in this process, its stop handler installed) finishes step 1, commits
    and raises Preempted (the command's exit 75). Tied to the request, not a timer, so the stop
    lands in step 1 however loaded the machine is."""
    import os
    import signal
    import threading
    import time

    def watch():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if server.score_requests:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_image_to_video_grpo_on_ray_stopped_by_sigterm_resumes_exactly(ray_cluster, tmp_path):
    """Two steps of image-to-video GRPO on two Ray actors (brightness frame by frame at a service
    this test hosts, beside the built-in I2V verifier on whole clips; the moving average every
    step): every metric, on-policy ratios; straight, and stopped by SIGTERM in its first step then
    resumed with --exact: the same metrics rows and bit-equal policy, moving-average and optimizer
    tensors."""
    from test_nft_ray import _checkpoint_tensors

    from cosmos_rl.commands import launch
    from cosmos_rl.core.errors import Preempted
    from cosmos_rl.rewards.server import RewardServer
    from cosmos_rl.trainers.grpo import METRIC_NAMES

    def train(name: str, url: str = "") -> int:
        rewards = (f'rl.rewards=[{{name="brightness", revision="builtin-v1", url="{url}"}}, '
                   '{name="shapes_video_i2v_partial", revision="builtin-v1"}]')
        return launch.train(_config(tmp_path, *I2V, "rl.reward={}", rewards, f'job.name="{name}"'), MANIFEST, Console(stderr=True))

    assert train("straight") == 0
    straight, split = tmp_path / "straight", tmp_path / "split"
    with RewardServer("127.0.0.1", 0, revision="builtin-v1") as server:
        watcher = _sigterm_at_first_score(server)
        with pytest.raises(Preempted):
            train("split", server.url)
        watcher.join(timeout=5)
        assert [r["step"] for r in _rows(split)] == [1]
        assert launch.resume(split, [], exact=True, console=Console(stderr=True)) == 0

    strip = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}  # noqa: E731
    a_rows, b_rows = _rows(straight), _rows(split)
    assert [strip(r) for r in a_rows] == [strip(r) for r in b_rows] and [r["step"] for r in a_rows] == [1, 2]
    assert all(0.0 <= r["train/shapes_video_i2v_partial/reward_mean"] <= 1.0 and r["train/grad_norm"] > 0 for r in a_rows)
    for row in a_rows:
        assert not [name for name in METRIC_NAMES if name not in row]
        assert row["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    a, b = _checkpoint_tensors(straight, 2, tmp_path), _checkpoint_tensors(split, 2, tmp_path)
    kept = [k for k in a if k.startswith(("policy.", "ema.", "optimizer."))]
    assert any(k.startswith("ema.") for k in kept) and any(k.startswith("optimizer.") for k in kept) and set(a) == set(b)
    for key in kept:
        assert torch.equal(a[key], b[key]), key
