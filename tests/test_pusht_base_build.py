"""The Push-T base build's stages on a tiny budget (`commands.pusht_base_build`): the dataset, the
starting model (the video base's weights plus action heads), the VAE stage, the VAE gate that
stops the build, the forward-dynamics stage, the written weights, and a rerun that continues."""

from __future__ import annotations

import hashlib
import json
import tomllib
import types

import numpy as np
import pytest
import torch

from cosmos_rl.commands import pusht_base_build as pb
from cosmos_rl.core.actions import EMBODIMENT_DOMAIN_IDS
from cosmos_rl.models.build import build_preset, load_parts

TINY = ["--samples", "2", "--episode-frames", "10", "--vae-steps", "1", "--vae-batch", "2", "--steps", "1", "--batch", "2",
        "--held-out-episodes", "2", "--checkpoint-every", "1", "--vae-late-steps", "0"]  # fmt: skip


def _build(tmp_path, *extra):
    return pb.main(["build", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), *TINY, *extra])


def test_the_start_is_the_video_base_with_pusht_action_heads():
    parts, video = pb.initial_parts(0, patch=2), build_preset("shapes_video", 0)
    config = parts.transformer.config
    assert config.action_gen and config.num_embodiment_domains == 21 and config.action_dim >= 2
    assert EMBODIMENT_DOMAIN_IDS["pusht"] < config.num_embodiment_domains
    ours, theirs = parts.transformer.state_dict(), video.transformer.state_dict()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())
    assert sorted({k.split(".")[0] for k in set(ours) - set(theirs)}) == ["action_modality_embed", "action_proj_in", "action_proj_out"]
    # At patch 4 (the build's default) every weight but the patch projections is still the video base's.
    four = pb.initial_parts(0).transformer
    assert four.config.latent_patch_size == 4 and four.config.patch_latent_dim == 4 * 4 * 4
    other = {k for k, v in four.state_dict().items() if k in theirs and v.shape != theirs[k].shape}
    assert other == {"proj_in.weight", "proj_out.weight", "proj_out.bias"}
    assert all(torch.equal(four.state_dict()[k], v) for k, v in theirs.items() if k not in other)
    # The fine VAE layout (no temporal stage, one spatial stage): every weight it has is the video VAE's.
    vae, theirs = parts.vae.state_dict(), video.vae.state_dict()
    assert set(vae) < set(theirs) and all(torch.equal(v, theirs[k]) for k, v in vae.items())
    assert parts.vae.config.scale_factor_temporal == 1 and parts.vae.config.scale_factor_spatial == 2
    assert list(parts.vae.config.latents_mean) == list(video.vae.config.latents_mean)
    clip = torch.zeros(1, 3, 9, 32, 32)
    assert tuple(parts.vae.encode(clip).latent_dist.mode().shape[2:]) == (9, 16, 16)  # a latent frame a frame, 16 x 16 cells


def test_the_gate_stops_the_build_when_ground_truth_through_the_vae_fails(tmp_path, capsys):
    # One VAE step from the shapes video VAE (drawn for black backgrounds) leaves Push-T's white
    # scene unrecognisable: ground truth scores 0 < 0.9 and the transformer never trains.
    assert _build(tmp_path) == 2
    err = capsys.readouterr().err
    assert "the VAE gate failed: ground truth through the trained VAE scores strict 0.0000 < 0.9" in err and "--vae-steps" in err
    work = tmp_path / "work"
    assert json.loads((work / "dataset" / "meta" / "info.json").read_text())["total_episodes"] == 2
    assert (work / "runs" / "vae" / "metrics.jsonl").is_file()
    assert not (work / "runs" / "transformer").exists() and not (tmp_path / "out").exists()


def test_every_stage_runs_and_a_rerun_continues(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pb, "VAE_GATE", 0.0)  # the plumbing past the gate, on a VAE trained one step (and one late step)
    assert _build(tmp_path, "--vae-late-steps", "1") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"transformer.safetensors", "vae.safetensors"}
    assert manifest["vae_gate"]["windows"] == 2 * 5  # 2 held-out episodes of 25 frames, windows every 4 frames
    assert manifest["action"]["embodiment"] == "pusht" and manifest["media"] == {"frames": 9, "size": 32, "fps": 10.0}
    assert set(manifest["wall_clock_s"]) == {"dataset", "vae_gate", "vae", "vae_late", "transformer"}
    # The VAE stage ran (preflighted) with the verifier's pixel classes weighted.
    stage = tomllib.loads((tmp_path / "work" / "runs" / "vae" / "manifest.toml").read_text())
    assert stage["rl"]["pixel_weights"] == {"suite": "pusht", "classes": {"agent": 30.0}, "miss": 100.0}
    # The late VAE stage starts from the VAE stage's weights with the misses weighted 1,000, and the
    # model the transformer trains on carries the late stage's VAE.
    work = tmp_path / "work"
    late = tomllib.loads((work / "runs" / "vae_late" / "manifest.toml").read_text())
    assert late["rl"]["pixel_weights"]["miss"] == 1000.0 and late["model"]["path"] == str((work / "vae_early").resolve())
    early, after = load_parts(work / "vae_early").vae.state_dict(), load_parts(work / "vae_model").vae.state_dict()
    assert any(not torch.equal(early[k], v) for k, v in after.items())
    rows = [json.loads(line) for line in (tmp_path / "work" / "runs" / "transformer" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and np.isfinite(rows[0]["train/frames_loss"]) and "train/actions_loss" not in rows[0]
    model = load_parts(tmp_path / "work" / "model", heads=True)
    assert model.transformer.config.action_gen and model.prompt_template == "minimal"
    assert model.transformer.config.latent_patch_size == pb.PATCH == 4
    # The latent statistics measured after the VAE stage travel with the model.
    assert list(model.vae.config.latents_mean) == manifest["latents_mean"] != [0.0] * 4
    capsys.readouterr()
    # A rerun with one more transformer step continues the finished stages rather than redoing them.
    assert _build(tmp_path, "--steps", "2", "--vae-late-steps", "1") == 0
    assert "vae: steps 1 -> 1" in capsys.readouterr().out
    rows = (tmp_path / "work" / "runs" / "transformer" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2
    # The transformer stage keeps the patch it started at.
    assert _build(tmp_path, "--steps", "2", "--vae-late-steps", "1", "--patch", "2") == 2
    assert "--patch 2: " in capsys.readouterr().err
    # The VAE stage cannot move under the late stage that started from it.
    assert _build(tmp_path, "--steps", "2", "--vae-late-steps", "1", "--vae-steps", "2") == 2
    assert "started from the VAE stage at step 1, and that stage is now at 2" in capsys.readouterr().err


def test_the_vae_stage_weights_the_verifiers_pixel_classes(tmp_path, capsys):
    args = pb._parser().parse_args(["build", "--work", str(tmp_path)])
    assert pb.pixel_weights(args) == {"suite": "pusht", "classes": {"agent": 30.0}, "miss": 100.0}
    off = pb._parser().parse_args(["build", "--work", str(tmp_path), "--vae-classes", "", "--vae-miss", "1"])
    assert pb.pixel_weights(off) == {}
    assert pb.main(["build", "--work", str(tmp_path / "w"), "--vae-classes", "agent:30"]) == 2
    assert "--vae-classes: expected NAME=WEIGHT" in capsys.readouterr().err


def test_vae_weights_replace_the_vae_stage_and_a_wrong_file_is_refused(tmp_path, capsys):
    from cosmos_rl.core.errors import UserError
    from cosmos_rl.models.build import save_parts

    dataset = pb.write_episodes(tmp_path / "ds", 2, 0, 10, 32)
    start = pb.initial_parts(0)
    save_parts(start, tmp_path / "init")
    state = {k: v + 0.01 for k, v in start.vae.state_dict().items()}  # a VAE unlike the init's
    torch.save(state, tmp_path / "vae.pt")
    parts, source, given = pb.given_vae(str(tmp_path / "vae.pt"), tmp_path / "init", dataset, 32)
    assert all(torch.equal(parts.vae.state_dict()[k], v) for k, v in state.items())
    assert len(source) == 2 * (10 - 9 + 1)  # every 9-frame window of two 10-frame episodes
    assert given["sha256"] == hashlib.sha256((tmp_path / "vae.pt").read_bytes()).hexdigest()
    # A build's own VAE file (safetensors) is taken the same way.
    from safetensors.torch import save_file

    save_file(state, tmp_path / "vae.safetensors")
    parts, _, _ = pb.given_vae(str(tmp_path / "vae.safetensors"), tmp_path / "init", dataset, 32)
    assert all(torch.equal(parts.vae.state_dict()[k], v) for k, v in state.items())
    torch.save({"encoder.conv_in.weight": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not the fine layout's VAE"):
        pb.given_vae(str(tmp_path / "other.pt"), tmp_path / "init", dataset, 32)
    (tmp_path / "bytes.pt").write_bytes(b"not a state dict")
    with pytest.raises(UserError, match="cannot read it as a state dict"):
        pb.given_vae(str(tmp_path / "bytes.pt"), tmp_path / "init", dataset, 32)
    # A work folder whose VAE stage already trained is not silently set aside.
    (tmp_path / "work" / "runs" / "vae").mkdir(parents=True)
    assert _build(tmp_path, "--vae-weights", str(tmp_path / "vae.pt")) == 2
    assert "holds a VAE stage this build trained" in capsys.readouterr().err


def test_the_held_out_seed_is_refused_as_a_training_seed(tmp_path, capsys):
    assert _build(tmp_path, "--seed", str(pb.HELD_OUT_SEED)) == 2
    assert "is the held-out episodes' seed" in capsys.readouterr().err


def test_ground_truth_frames_pass_the_gate_scoring():
    # The simulator's own frames at the build's size are what the gate's scorer must pass (the
    # verifier's own property at 32 px); a VAE can only lose from there.
    clips, states, kinds = pb.held_out_windows(2, pb.SIDE)
    scores = pb.score_clips(clips, states, kinds)
    assert scores["strict"] == 1.0 and set(kinds) == {"planner", "random"}


def test_a_stage_stopped_by_a_signal_still_counts_its_seconds(tmp_path, monkeypatch):
    # The stage's wall-clock (manifest.json's wall_clock_s) sums every call that trained it, the
    # calls a SIGTERM ended included: they committed steps the final figure must pay for.
    from cosmos_rl.commands import base_build
    from cosmos_rl.core.errors import Preempted
    from cosmos_rl.planning import plan, run_dir
    from cosmos_rl.trainers import sft

    class Stopped:
        def __init__(self, *args, **kwargs):
            self.step = 3

        def run(self):
            raise Preempted("stopped by SIGTERM after committing step 3")

    monkeypatch.setattr(plan, "run_dir", lambda config: tmp_path)
    monkeypatch.setattr(run_dir, "has_committed_checkpoint", lambda path: True)
    monkeypatch.setattr(sft, "SFTTrainer", Stopped)
    (tmp_path / "wall_clock_s.json").write_text(json.dumps({"seconds": 10.0}))
    config = types.SimpleNamespace(rl=types.SimpleNamespace(max_steps=5), job=types.SimpleNamespace(name="vae"))
    with pytest.raises(Preempted):
        base_build.train_stage(config)
    assert json.loads((tmp_path / "wall_clock_s.json").read_text())["seconds"] > 10.0
