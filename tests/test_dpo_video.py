"""Diffusion-DPO on clip pairs: mp4 pairs from shards and JSONL, the per-sample MSE of a clip by hand,
two real steps on 5-frame clips, straight against stopped-and-resumed, the latent cache's clip
entries and `validate --data` on bad clip pairs, on a Nano-layout folder whose VAE compresses time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _clip_helpers import squares_clip, squares_mp4, with_damaged_samples, with_declared_frames, with_sps_size
from _inproc import cosmos
from _models_helpers import NANO_HEADS
from _video_folders import video_nano_folder

from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse
from cosmos_rl.config import load, preflight
from cosmos_rl.data.clip_files import encode_clip
from cosmos_rl.data.pairs import JsonlPairs, SyntheticPairs, TarShardPairs
from cosmos_rl.data.tar_write import add_member, shard
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.models import latent_cache as lc
from cosmos_rl.trainers.dpo import DPOTrainer

CPU = torch.device("cpu")
FRAMES = 5  # 2 latent frames with the folder's 4x temporal VAE; 32x32 -> 8x8 latent cells
CLIP, IMAGE = MediaSpec(FRAMES, 32, 32), MediaSpec.image(32)  # the data readers' media of a clip run and an image run
ROOT = Path(__file__).resolve().parent.parent
DPO = str(ROOT / "manifests" / "dpo_t2i_smoke.toml")


def winner_clip(i: int, frames: int = FRAMES) -> np.ndarray:
    return np.roll(squares_clip(frames), i, axis=2)


def loser_clip(i: int, frames: int = FRAMES) -> np.ndarray:
    """The winner's clip frozen on its first frame and dimmed: same prompt, size and frame count."""
    frozen = np.repeat(winner_clip(i, frames)[:1], frames, axis=0)
    return (frozen // 2).astype(np.uint8)


PROMPTS = ["a red square moving right", "a blue square moving down", "a small square changing colour"]


def write_pair_shard(path: Path, count: int, start: int = 0) -> str:
    """One webdataset shard of clip pairs: <key>.json, <key>.winner.mp4, <key>.loser.mp4."""
    with shard(path) as tar:
        for i in range(start, start + count):
            key = f"{i:06d}"
            add_member(tar, f"{key}.json", json.dumps({"id": f"clip-{i}", "prompt": PROMPTS[i % 3]}).encode())
            add_member(tar, f"{key}.winner.mp4", encode_clip(winner_clip(i), 16.0))
            add_member(tar, f"{key}.loser.mp4", encode_clip(loser_clip(i), 16.0))
    return str(path)


def write_pair_jsonl(folder: Path, count: int, start: int = 100) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(start, start + count):
        (folder / f"w{i}.mp4").write_bytes(encode_clip(winner_clip(i), 16.0))
        (folder / f"l{i}.mp4").write_bytes(encode_clip(loser_clip(i), 16.0))
        rows.append({"id": f"clip-{i}", "prompt": PROMPTS[i % 3], "winner": f"w{i}.mp4", "loser": f"l{i}.mp4"})
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return video_nano_folder(tmp_path_factory.mktemp("video_dpo") / "pipe", seed=5)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip_pairs")
    return [write_pair_shard(root / "pairs-000000.tar", 4)], write_pair_jsonl(root / "val", 2)


def make_config(tmp_path, folder, shards, **rl):
    raw = {
        "job": {"output_dir": str(tmp_path), "name": rl.pop("name", "run"), "progress": False, "seed": 1},
        "model": {"path": str(folder), "lora": {"rank": 4, "alpha": 8.0}, "num_frames": FRAMES, "fps": 16.0},
        "checkpoint": {"every": 0, "keep": 0},
        "grid": {"device": "cpu"},
        "rl": {"algorithm": "dpo", "beta": 500.0, "max_steps": 2, "pairs_per_step": 2, "optimizer": {"lr": 1e-2},
               "init_keys_to_skip_loading": NANO_HEADS, "latent_cache": "memory", "data": {"shards": shards}, **rl},
    }  # fmt: skip
    return load.structure(raw)


# ------------------------------------------------------------------------------------ by hand
def test_a_clips_mse_is_the_mean_over_all_its_latent_frames_by_hand():
    """The loss is the image loss: a side's MSE averages every latent element, frames included, so a
    clip weighs as much as an image in the DPO sum whatever its length. One pair of two-frame,
    one-element latents: winner errors [2, 0] -> (4 + 0) / 2 = 2, loser [1, 1] -> 1; the reference
    makes 1 on both. inside = -0.5 x 10 x ((2 - 1) - (1 - 1)) = -5, loss = -logsigmoid(-5) = 5.00672."""
    target = torch.zeros(2, 1, 2, 1, 1)
    policy = torch.tensor([[2.0, 0.0], [1.0, 1.0]]).view(2, 1, 2, 1, 1)
    mse = per_sample_mse(policy, target)
    assert mse.tolist() == [2.0, 1.0]
    # A clip of one frame repeated has the MSE of that frame alone (no factor of T).
    assert per_sample_mse(policy[:1, :, :1].repeat(1, 1, 4, 1, 1), target[:1, :, :1].repeat(1, 1, 4, 1, 1)).item() == 4.0
    loss, metrics = dpo_loss(mse[:1], mse[1:], torch.ones(1), torch.ones(1), beta=10.0)
    assert loss.item() == pytest.approx(math.log1p(math.exp(5.0)), abs=1e-6)
    assert metrics["dpo_reward_margin"].item() == -5.0 and metrics["dpo_accuracy"].item() == 0.0


# ------------------------------------------------------------------------------------ the data
def test_clip_pairs_decode_exactly_from_shards_jsonl_and_the_generator(data):
    shards, jsonl = data
    from_shards, from_jsonl = TarShardPairs(shards, CLIP), JsonlPairs(jsonl, CLIP)
    unit = lambda clip: torch.from_numpy(clip).permute(3, 0, 1, 2).float() / 255  # noqa: E731
    pair = from_shards[1]
    assert (pair.id, pair.prompt) == ("clip-1", PROMPTS[1])
    assert torch.equal(pair.winner, unit(winner_clip(1))) and torch.equal(pair.loser, unit(loser_clip(1)))
    assert torch.equal(from_jsonl[0].winner, unit(winner_clip(100))) and from_jsonl[0].loser.shape == (3, FRAMES, 32, 32)
    assert from_shards.membership_ids() == ["clip-0", "clip-1", "clip-2", "clip-3"]
    # Generated clip pairs: frame 0 is the image pair's winner, and the shape moves 2 px a frame.
    image, clip = SyntheticPairs(3, IMAGE, 7)[2], SyntheticPairs(3, CLIP, 7)[2]
    assert clip.winner.shape == clip.loser.shape == (3, FRAMES, 32, 32) and clip.prompt == image.prompt
    assert torch.equal(clip.winner[:, 0], image.winner)
    assert torch.equal(clip.winner[:, 3], torch.roll(clip.winner[:, 0], 6, dims=2))


def test_a_pair_of_the_wrong_kind_for_the_run_is_refused_naming_its_row(tmp_path, data):
    shards, jsonl = data
    with pytest.raises(UserError, match=r"pairs-000000\.tar sample '000000': winner is a clip \(winner\.mp4\), but this run trains images"):
        TarShardPairs(shards, IMAGE)
    with pytest.raises(UserError, match=r"pairs\.jsonl:1: winner .*w100\.mp4 is a clip, but this run trains images"):
        JsonlPairs(jsonl, IMAGE)
    (tmp_path / "w.png").write_bytes(b"png")
    (tmp_path / "l.mp4").write_bytes(squares_mp4(FRAMES))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "prompt": "p", "winner": "w.png", "loser": "l.mp4"}) + "\n")
    with pytest.raises(UserError, match=r"rows\.jsonl:1: winner .*w\.png is an image, but clips of 5 frames are expected"):
        JsonlPairs(rows, CLIP)
    # Every clip is held to the run's frame count: 9-frame clips in a 5-frame run stop the read with the row.
    nine = tmp_path / "nine"
    nine.mkdir()
    (nine / "w.mp4").write_bytes(squares_mp4(9))
    (nine / "l.mp4").write_bytes(encode_clip(loser_clip(0, 9), 16.0))
    (nine / "rows.jsonl").write_text(json.dumps({"id": "n", "prompt": "p", "winner": "w.mp4", "loser": "l.mp4"}) + "\n")
    with pytest.raises(UserError, match=r"rows\.jsonl:1 \(id 'n'\) winner: .*w\.mp4: too many frames: the clip declares 9, expected exactly 5"):
        JsonlPairs(nine / "rows.jsonl", CLIP)[0]


def test_a_factorys_clip_records_are_held_to_the_runs_frame_count():
    from cosmos_rl.data.pairs import CheckedFactorySource, PreferencePair

    clip = torch.rand(3, FRAMES, 32, 32, generator=torch.Generator().manual_seed(0))
    good = PreferencePair("a", "p", clip, clip.flip(-1))
    assert CheckedFactorySource([good], "m:f", CLIP)[0] is good
    short = PreferencePair("b", "p", clip[:, :4], clip[:, 1:])
    with pytest.raises(UserError, match=r"rl\.data\.factory 'm:f' index 0 \(id 'b'\): winner must be a \[3, F = 5, H, W\] clip tensor \(model\.num_frames\), got \(3, 4, 32, 32\)"):
        CheckedFactorySource([short], "m:f", CLIP)[0]
    with pytest.raises(UserError, match=r"winner must be a \[3, H, W\] tensor, got \(3, 5, 32, 32\)"):
        CheckedFactorySource([good], "m:f", IMAGE)[0]  # clips from a factory of an image run


# ------------------------------------------------------------------------------------ training
def test_two_dpo_steps_on_clips_take_a_real_gradient(tmp_path, folder, data):
    config = make_config(tmp_path, folder, data[0])
    assert [p for p in preflight.check(config) if p.severity == "error"] == []
    trainer = DPOTrainer(config, tmp_path / "run", CPU)
    assert trainer.timing == {"fps": 16.0, "temporal_factor": 4}
    latents, ids = trainer._pair_tensors([trainer.train_source[i] for i in range(2)])
    assert latents.shape == (4, 4, 2, 8, 8) and len(ids) == 4  # winners then losers, [2P, C, T, h, w]
    before = {n: p.detach().clone() for n, p in trainer.model.transformer.named_parameters() if p.requires_grad}
    first = trainer.train_step(1)
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-6) and first["train/dpo_accuracy"] == 0.5
    assert math.isfinite(first["train/grad_norm"]) and first["train/grad_norm"] > 0
    moved = [n for n, p in trainer.model.transformer.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and all("lora_" in n for n in moved)
    second = trainer.train_step(2)
    assert second["train/loss"] != pytest.approx(math.log(2), abs=1e-6)
    assert second["train/policy_mse_winner"] != second["train/ref_mse_winner"]


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith("_per_s")} for r in rows]


def test_stopped_after_one_step_and_resumed_equals_straight_with_val_metrics(tmp_path, folder, data):
    shards, jsonl = data
    val = {"every": 1, "max_pairs": 2, "data": {"jsonl": str(jsonl)}}
    straight = DPOTrainer(make_config(tmp_path, folder, shards, name="straight", validation=val), tmp_path / "straight", CPU)
    straight.run()
    DPOTrainer(make_config(tmp_path, folder, shards, name="split", validation=val, max_steps=1), tmp_path / "split", CPU).run()
    resumed = DPOTrainer(make_config(tmp_path, folder, shards, name="split", validation=val), tmp_path / "split", CPU, resume=True)
    resumed.run()
    rows = _rows(tmp_path / "straight")
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["val/loss"]) for r in rows)
    assert rows[0]["val/dpo_accuracy"] != rows[1]["val/dpo_accuracy"] or rows[0]["val/loss"] != rows[1]["val/loss"]
    assert _rows(tmp_path / "split") == rows
    for (name, a), b in zip(straight.module.state_dict().items(), resumed.module.state_dict().values()):
        assert torch.equal(a, b), name


def test_rl_eval_of_a_clip_run_samples_clips_and_scores_them_per_task(tmp_path, folder, data):
    """[rl.eval] with the moving-shapes verifier: the trained policy samples one clip per task and
    the rows carry every task's strict and partial score (an untrained folder scores 0)."""
    evaluation = {"every": 1, "per_task": 1, "seeds": 1, "sample_steps": 2, "reward": "shapes_video_strict"}
    config = make_config(tmp_path, folder, data[0], eval=evaluation, max_steps=1)
    assert [p for p in preflight.check(config) if p.severity == "error"] == []
    row = DPOTrainer(config, tmp_path / "run", CPU).run()[-1]
    tasks = ("motion", "two_motions", "static", "colour_change", "counting_motion", "turn")
    assert all(0.0 <= row[f"eval/task/{t}"] <= 1.0 and 0.0 <= row[f"eval/task_partial/{t}"] <= 1.0 for t in tasks)
    assert "train/loss" in row and "eval/score" in row


def test_train_and_validation_clip_pairs_sharing_an_id_stop_the_run(tmp_path, folder, data):
    leaked = write_pair_jsonl(tmp_path / "leak", 1, start=2)  # id clip-2 is a training pair
    val = {"every": 1, "data": {"jsonl": str(leaked)}}
    with pytest.raises(UserError, match=r"rl\.validation: 1 validation id\(s\) also appear in the training data \('clip-2'\)"):
        DPOTrainer(make_config(tmp_path, folder, data[0], validation=val), tmp_path / "run", CPU)


def test_the_disk_cache_keeps_clip_latents_and_serves_them_back(tmp_path, folder, data, monkeypatch):
    trainer = DPOTrainer(make_config(tmp_path, folder, data[0], latent_cache="disk"), tmp_path / "run", CPU)
    pairs = [trainer.train_source[i] for i in range(2)]
    latents, _ = trainer._pair_tensors(pairs)
    entries = sorted((tmp_path / ".cache" / "latents").rglob("*.safetensors"))
    assert len(entries) == 4  # two winners and two losers, one file each
    from safetensors import safe_open

    with safe_open(str(entries[0]), framework="pt") as handle:
        assert json.loads(handle.metadata()["shape"]) == [4, 2, 8, 8]  # [C, T, h, w]: the clip's two latent frames
    monkeypatch.setattr(lc, "encode_pixels", lambda *a: pytest.fail("the VAE ran on cached clips"))
    fresh = lc.LatentCache(trainer.model.vae, tmp_path / ".cache" / "latents")
    clips = torch.stack([p.winner for p in pairs] + [p.loser for p in pairs])
    assert torch.equal(fresh.encode(clips), latents) and fresh.hits == 4
    # The same pixels as single images are other inputs: never served a clip's entry.
    assert lc.input_key(clips[0, :, 0]) not in {e.stem for e in entries}


def test_plan_counts_the_policy_forwards_clips_per_rank():
    """plan's train_activation_mib_per_rank for clip pairs: 2 x pairs_per_rank clips (winners and
    losers in the policy's forward with grad). Tiny preset (hidden 64, MLP 128, 2 layers, patch 2; VAE
    4x in space, none in time): a 5-frame 32x32 clip is 5 x 4 x 4 = 80 tokens,
    2 x 80 x (12 x 64 + 4 x 128) x 4 bytes = 0.78125 MiB; the smoke manifest's 4 pairs per rank: 8 clips."""
    from cosmos_rl.planning import plan

    def per_step(*extra):
        return plan.build(load.load(DPO, [f"model.num_frames={FRAMES}", "model.fps=16", *extra]), DPO)["per_step"]

    assert per_step() == {"pairs": 8, "pairs_per_rank": 4, "train_activation_mib_per_rank": 6.25}
    assert per_step("rl.pairs_per_step=2")["train_activation_mib_per_rank"] == pytest.approx(0.78125 * 2, abs=0.005)
    assert "train_activation_mib_per_rank" not in plan.build(load.load(DPO, []), DPO)["per_step"]  # images: as before


# ------------------------------------------------------------------------------ validate --data
def test_validate_data_exits_2_naming_every_bad_clip_pair_row(tmp_path):
    good = encode_clip(winner_clip(0), 16.0)
    files = {
        "good.mp4": good,
        "few.mp4": squares_mp4(3),
        "wide.mp4": encode_clip(squares_clip(FRAMES, 32, 48), 16.0),
        "corrupt.mp4": with_damaged_samples(good),
        "bomb.mp4": with_sps_size(good, 8192, 8192),
        "long.mp4": with_declared_frames(good, 1_000_000),
    }
    for name, blob in files.items():
        (tmp_path / name).write_bytes(blob)
    (tmp_path / "other.mp4").write_bytes(encode_clip(loser_clip(0), 16.0))
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps({"id": n, "prompt": "p", "winner": n, "loser": "other.mp4"}) + "\n" for n in files))
    args = ["validate", DPO, "rl.data.synthetic_pairs=0", f'rl.data.jsonl="{rows}"', f"model.num_frames={FRAMES}",
            "rl.validation.every=0", "--data", "all"]  # fmt: skip
    result = cosmos(*args, cwd=ROOT)  # in-process (tests/_inproc.py): the exit code and the lines are the subject
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join((result.stdout + result.stderr).split())
    expected = {
        2: "few.mp4: too few frames: the clip declares 3, expected exactly 5",
        3: "wide.mp4: wrong clip size: 48x32",
        4: "corrupt.mp4: cannot decode clip:",
        5: "bomb.mp4: cannot decode clip: too large to decode safely (declares 8192x8192",
        6: "long.mp4: cannot decode clip: too long to decode safely (declares 1000000 frames",
    }
    for line, text in expected.items():
        assert f"pairs.jsonl:{line} (id '{list(files)[line - 1]}') winner: {tmp_path / list(files)[line - 1]}" in out, out
        assert text in out, (text, out)
    assert "(id 'good.mp4')" not in out


# ------------------------------------------------------------------------------ under torchrun
def _trained_tensors(run_dir: Path, step: int, tmp: Path) -> dict[str, torch.Tensor]:
    from test_nft_ray import _checkpoint_tensors

    return {k: v for k, v in _checkpoint_tensors(run_dir, step, tmp).items() if k.startswith(("policy.", "optimizer."))}


@pytest.mark.slow
def test_clip_dpo_under_torchrun_stopped_by_sigterm_resumes_exactly(tmp_path):
    """`cosmos-rl train` of the DPO smoke manifest on 5-frame clips: 2 ranks (gloo, FSDP2), the
    generator's clip pairs, validation on held-out clip pairs. Three steps straight; the same run
    stopped by a SIGTERM to its process group after its first step (exit 75, a committed step),
    then `resume --exact`: the same metrics rows and bit-equal weights and optimizer state."""
    import os
    import signal
    import time

    from _overrides import DPO_SMALL_WITH_VALIDATION

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}

    def cosmos(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cosmos_rl.cli", *args], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip

    def overrides(name: str) -> list[str]:
        return [*DPO_SMALL_WITH_VALIDATION, f"model.num_frames={FRAMES}", "model.fps=16", "rl.max_steps=3",
                f'job.output_dir="{tmp_path}"', f'job.name="{name}"']  # fmt: skip

    # The straight reference through `launch.train` in this process (what `cosmos-rl train` runs,
    # without a second import of the stack); the run that is signalled is the real CLI.
    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.config import load

    assert launch.train(load.load(Path(DPO), overrides("straight")), Path(DPO), Console(stderr=True)) == 0
    split = cosmos("train", DPO, *overrides("split"))
    metrics = tmp_path / "split" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while split.poll() is None and time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.05)
    assert split.poll() is None, split.communicate()[1][-3000:]
    os.killpg(split.pid, signal.SIGTERM)  # the run's own group, as a scheduler signals it
    _, err = split.communicate(timeout=600)
    assert split.returncode == 75, err[-3000:]
    stopped = [r["step"] for r in _rows(tmp_path / "split")]
    assert stopped in ([1], [1, 2]), (stopped, err[-2000:])
    resumed = cosmos("resume", str(tmp_path / "split"), "--exact")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]

    rows = _rows(tmp_path / "straight")
    assert [r["step"] for r in rows] == [1, 2, 3] and _rows(tmp_path / "split") == rows
    assert rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-6) and rows[1]["train/loss"] != rows[0]["train/loss"]
    assert math.isfinite(rows[1]["val/loss"]) and rows[0]["train/grad_norm"] > 0
    a = _trained_tensors(tmp_path / "straight", 3, tmp_path)
    b = _trained_tensors(tmp_path / "split", 3, tmp_path)
    assert a and set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
