"""SFT on clips: clip shards through the trainer, first-frame conditioning held out of the loss,
and the clean-frame layout of the packed forward, on a Nano-layout folder whose VAE compresses time."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _clip_helpers import squares_clip
from _models_helpers import NANO_HEADS
from _video_folders import video_nano_folder

from cosmos_rl.algorithms.sft import flow_matching_loss
from cosmos_rl.config import load
from cosmos_rl.data.clip_shards import ClipRecord, write_clip_shards
from cosmos_rl.models.build import load_parts
from cosmos_rl.models.packing import velocity
from cosmos_rl.trainers.sft import SFTTrainer

CPU = torch.device("cpu")
FRAMES = 5  # 2 latent frames with the folder's 4x temporal VAE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return video_nano_folder(tmp_path_factory.mktemp("video_sft") / "pipe", seed=4)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("clip_shards")
    captions = ["a red square moving right", "a blue square moving down", "a small square changing colour"]
    records = [ClipRecord(squares_clip(FRAMES)[:, :, ::-1].copy() if i % 2 else squares_clip(FRAMES), captions[i % 3]) for i in range(6)]
    return [str(p) for p in write_clip_shards(out, records, fps=16.0, per_shard=3)]


def make_config(tmp_path, folder, shards, *, first_frame_share=0.0, **rl):
    # first_frame_share: the share of clips given their first frame ([model.condition], source "data")
    condition = {"condition": {"kind": "first_frame", "source": "data", "probability": first_frame_share}} if first_frame_share else {}
    raw = {
        "job": {"output_dir": str(tmp_path), "name": rl.pop("name", "run"), "progress": False, "seed": 1},
        "model": {"path": str(folder), "lora": {"rank": 0}, "num_frames": FRAMES, "fps": 16.0, **condition},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "sft", "max_steps": 3, "samples_per_step": 3, "optimizer": {"lr": 1e-3},
               "init_keys_to_skip_loading": NANO_HEADS, "data": {"shards": shards}, **rl},
    }  # fmt: skip
    return load.structure(raw)


def test_clean_frames_are_left_out_of_the_loss_by_hand():
    """One sample of two one-element latent frames [B=1, C=1, T=2, 1, 1]: target eps - x0 = [1, 1],
    prediction [3, 2], squared errors [4, 1]. All frames: (4 + 1) / 2 = 2.5; frame 0 clean: 1 / 1 = 1.
    Two samples, the first with frame 0 clean: (1 + 4 + 1) / 3 = 2."""
    x0, eps = torch.zeros(1, 1, 2, 1, 1), torch.ones(1, 1, 2, 1, 1)
    v = torch.tensor([3.0, 2.0]).view(1, 1, 2, 1, 1)
    assert flow_matching_loss(v, x0, eps).item() == 2.5
    assert flow_matching_loss(v, x0, eps, [1]).item() == 1.0
    assert flow_matching_loss(v.repeat(2, 1, 1, 1, 1), x0.repeat(2, 1, 1, 1, 1), eps.repeat(2, 1, 1, 1, 1), [1, 0]).item() == 2.0


def test_per_sample_clean_frames_in_one_packed_forward_match_each_sample_alone(folder):
    parts = load_parts(folder, skip_keys=NANO_HEADS)
    x = torch.randn(2, 4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7, 0.4])
    ids = [torch.arange(5, 17), torch.arange(9, 30)]
    timing = dict(fps=16.0, temporal_factor=4)
    with torch.no_grad():
        both = velocity(parts.transformer, x, sigma, ids, clean_frames=[1, 0], **timing)
        first = velocity(parts.transformer, x[:1], sigma[:1], ids[:1], clean_frames=1, **timing)
        second = velocity(parts.transformer, x[1:], sigma[1:], ids[1:], clean_frames=0, **timing)
    assert torch.equal(both[0, :, 0], torch.zeros_like(both[0, :, 0]))  # a clean frame is never predicted
    assert (both[:1] - first).abs().max() <= 1e-5 and (both[1:] - second).abs().max() <= 1e-5
    assert (first[0, :, 1:] - second[0, :, 1:]).abs().max() > 1e-4  # conditioning changes the rest


def test_sft_trains_clips_with_first_frame_conditioning_and_resumes_exactly(tmp_path, folder, shards):
    config = make_config(tmp_path, folder, shards, name="straight", first_frame_share=0.5)
    straight = SFTTrainer(config, tmp_path / "straight", CPU)
    straight.run()
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    conditioned = [r["train/first_frame_conditioned"] for r in rows]
    assert all(0 <= c <= 1 for c in conditioned) and 0 < sum(conditioned) < len(conditioned)
    first = SFTTrainer(make_config(tmp_path, folder, shards, name="split", first_frame_share=0.5, max_steps=1), tmp_path / "split", CPU)
    first.run()
    resumed = SFTTrainer(make_config(tmp_path, folder, shards, name="split", first_frame_share=0.5), tmp_path / "split", CPU, resume=True)
    resumed.run()
    for (name, a), b in zip(straight.module.state_dict().items(), resumed.module.state_dict().values()):
        assert torch.equal(a, b), name


def test_sft_continues_clips_holding_their_leading_latent_frames_and_resumes_exactly(tmp_path, folder, monkeypatch):
    """V2V: a 9-frame clip continued from its first five (tests/standin_conditions.FIRST_FIVE, every
    clip conditioned). The folder's VAE compresses time 4x, so the five given frames are the first
    two of three latent frames: both are the clean clip's own in every training forward, and only
    the third is in the loss. A run stopped after step 1 and resumed equals the straight run."""
    from cosmos_rl.trainers import sft as sft_module

    shards = [str(p) for p in write_clip_shards(tmp_path / "long", [ClipRecord(squares_clip(9), "a red square moving right")] * 2, fps=16.0, per_shard=2)]
    continued = {"model": {"num_frames": 9, "condition": {"kind": "standin_conditions:FIRST_FIVE", "source": "data", "probability": 1.0}}}

    def config(name, steps):
        raw = load.to_dict(make_config(tmp_path, folder, shards, name=name, max_steps=steps, samples_per_step=2))
        return load.structure({**raw, "model": {**raw["model"], **continued["model"]}})

    losses, forwards, encoded = [], [], []
    real_loss, real_velocity, real_encode = sft_module.flow_matching_loss, sft_module.velocity, sft_module.encode_pixels
    monkeypatch.setattr(sft_module, "encode_pixels", lambda *a: encoded.append(real_encode(*a)) or encoded[-1])
    monkeypatch.setattr(sft_module, "flow_matching_loss", lambda v, x0, eps, clean=None: losses.append(clean) or real_loss(v, x0, eps, clean))
    monkeypatch.setattr(sft_module, "velocity", lambda module, x_t, *a, **kw: forwards.append((x_t.detach().clone(), kw["clean_frames"])) or real_velocity(module, x_t, *a, **kw))
    straight = SFTTrainer(config("straight", 2), tmp_path / "straight", CPU)
    straight.run()
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/first_frame_conditioned"] for r in rows] == [1.0, 1.0] and all(math.isfinite(r["train/loss"]) for r in rows)
    assert losses == [[2, 2], [2, 2]] and [clean for _, clean in forwards] == [[2, 2], [2, 2]]
    for (x_t, _), x0 in zip(forwards, encoded, strict=True):  # the given latent frames are the clean clip's own
        assert x_t.shape[2] == 3 and torch.equal(x_t[:, :, :2], x0[:, :, :2]) and not torch.equal(x_t[:, :, 2:], x0[:, :, 2:])
    SFTTrainer(config("split", 1), tmp_path / "split", CPU).run()
    resumed = SFTTrainer(config("split", 2), tmp_path / "split", CPU, resume=True)
    resumed.run()
    for (name, a), b in zip(straight.module.state_dict().items(), resumed.module.state_dict().values()):
        assert torch.equal(a, b), name


def test_sft_trains_the_video_vae_on_clips(tmp_path, folder, shards):
    trainer = SFTTrainer(make_config(tmp_path, folder, shards, train="vae", samples_per_step=2), tmp_path / "vae", CPU)
    rows = [trainer.train_step(step) for step in range(1, 3)]
    assert all(math.isfinite(r["train/loss"]) and math.isfinite(r["train/psnr"]) for r in rows)
    assert "train/mse" not in rows[0]  # plain MSE: the loss is the MSE


def test_foreground_weighted_vae_reports_psnr_from_the_plain_mse(tmp_path, folder, shards):
    plain = SFTTrainer(make_config(tmp_path, folder, shards, name="plain", train="vae", samples_per_step=2), tmp_path / "plain", CPU)
    weighted = SFTTrainer(make_config(tmp_path, folder, shards, name="fg", train="vae", samples_per_step=2, foreground_weight=10.0),
                          tmp_path / "fg", CPU)  # fmt: skip
    first, row = plain.train_step(1), weighted.train_step(1)
    # Same weights and clips at step 1: the plain MSE agrees, the trained (weighted) loss does not.
    assert row["train/mse"] == pytest.approx(first["train/loss"], rel=1e-6)
    assert row["train/psnr"] == pytest.approx(first["train/psnr"], rel=1e-6)
    assert row["train/loss"] > row["train/mse"] * 1.5  # the shapes' foreground is where the error is


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith("_per_s")} for r in rows]


@pytest.mark.slow
def test_the_video_sft_manifest_trains_evaluates_and_resumes_exactly_after_sigterm(shipped_manifests, tmp_path):
    """`cosmos-rl train manifests/sft_video_shapes_cpu.toml` at a short budget under torchrun: a
    SIGTERM commits and exits 75, `resume --exact` finishes, and every logged number (eval/ rows
    included) equals a straight run's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    manifest = shipped_manifests / "sft_video_shapes_cpu.toml"
    small = ["rl.samples_per_step=2", "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", "rl.eval.sample_steps=2",
             "job.log_every=1", "checkpoint.every=0", "rl.optimizer.warmup_steps=0", f'job.output_dir="{tmp_path}"']  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}

    def cosmos(*args, **kw):
        return subprocess.run([sys.executable, "-m", "cosmos_rl.cli", *args], cwd=shipped_manifests.parent, env=env,
                              capture_output=True, text=True, timeout=600, **kw)  # fmt: skip

    # The straight reference through `launch.train` in this process (what `cosmos-rl train` runs, paths
    # pinned to the manifest's folder, without a second import of the stack); the stopped run is the CLI.
    from rich.console import Console

    from cosmos_rl.commands import launch

    config = load.load(manifest, [*small, 'job.name="straight"', "rl.max_steps=4"])
    assert launch.train(config, manifest, Console(stderr=True)) == 0
    argv = [sys.executable, "-m", "cosmos_rl.cli", "train", str(manifest), *small, 'job.name="split"', "rl.max_steps=100000"]
    proc = subprocess.Popen(argv, cwd=shipped_manifests.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    metrics, deadline = tmp_path / "split" / "metrics.jsonl", time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-3000:]
    resumed = cosmos("resume", str(tmp_path / "split"), "--exact", "rl.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _rows(tmp_path / "straight")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["step"] for r in rows if "eval/score" in r] == [2, 4]
    assert "eval/task/motion" in rows[1] and "train/first_frame_conditioned" in rows[0]
    assert _rows(tmp_path / "split") == rows


def test_a_video_trained_checkpoint_exports_a_folder_the_stock_pipeline_makes_video_from(tmp_path, folder, shards):
    from cosmos_rl.commands.export import export_run
    from cosmos_rl.models.generate import generate
    from cosmos_rl.core.media import MediaSpec, latent_shape
    from cosmos_rl.models.sampler_settings import SamplerSettings
    from cosmos_rl.models.text import model_prompt_ids
    from _models_helpers import folder_pipeline

    config = make_config(tmp_path, folder, shards, name="run", max_steps=1, first_frame_share=0.5, optimizer={"lr": 5e-2})
    trainer = SFTTrainer(config, tmp_path / "run", CPU)
    trainer.run()
    (tmp_path / "run" / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    export_run(str(tmp_path / "run"), tmp_path / "model")
    pipe = folder_pipeline(tmp_path / "model")  # the folder alone, as diffusers loads it
    assert pipe.vae.config.temperal_downsample == [True, True]
    noise = torch.randn(1, *latent_shape(MediaSpec(FRAMES, 32, 32, 16.0), pipe.vae.config, pipe.transformer.config),
                        generator=torch.Generator().manual_seed(2))  # fmt: skip
    with torch.no_grad():
        video = pipe(prompt="a red square moving right", num_frames=FRAMES, height=32, width=32, fps=16.0, num_inference_steps=3,
                     guidance_scale=1.0, latents=noise, output_type="latent").video  # fmt: skip
    # The same clip from the trained weights in the project's sampler: the export is the checkpoint.
    media = MediaSpec(FRAMES, 32, 32, 16.0)
    ids = model_prompt_ids(trainer.parts.tokenizer, "chat", ["a red square moving right"], media)
    trained, _ = generate(trainer.parts, media, ids, noise, SamplerSettings(3, None, 1.0))
    assert video.shape == trained.shape == (1, 4, 2, 8, 8)
    assert (video - trained).abs().max() <= 2e-5
