"""Image-to-video NFT (docs/video.md "Conditioning: image to video"): `[model.condition]` conditions every rollout on a first
frame, held clean in rollouts and training and left out of the loss; the prompt file's `image`
column and its checks; the preflight rules; the verifier's first-frame constraint.

Tiny sizes as tests/test_nft_video.py: the video base, whose causal VAE halves time (5 frames are
3 latent frames; latent frame 0 is pixel frame 0's alone), 5 frames at 32x32, a group of 2, one row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from _image_helpers import bomb_png, png_bytes
from cosmos_rl.config import load, preflight
from cosmos_rl.core.condition import FIRST_FRAME, Condition
from cosmos_rl.core.errors import UserError

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "nft_i2v_shapes_cpu.toml"
VIDEO_PROMPTS = REPO / "manifests" / "shapes_video_train.txt"
FRAMES = 5
LATENT_FRAMES = 3  # 1 + (5 - 1) / 2
TINY = [
    f"model.num_frames={FRAMES}", "rl.group_size=2", "rl.prompts_per_step=1", "rl.timesteps_per_sample=1",
    "job.progress=false", "job.log_every=1", "checkpoint.keep=0", "rl.sample_steps=2", "rl.max_steps=1",
    "rl.eval.every=0", "rl.sample_grid_every=0",
]
BRIGHTNESS = ['rl.reward.name="brightness"']  # varies within a group from the first step (test_nft_video.py)


def _config(tmp_path: Path, *extra: str):
    return load.load(MANIFEST, [*TINY, f'rl.prompts.file="{VIDEO_PROMPTS}"', f'job.output_dir="{tmp_path}"', *extra])


def _errors(config) -> dict[str, str]:
    return {p.path: f"{p.problem} | {p.fix}" for p in preflight.check(config, MANIFEST.parent) if p.severity == "error"}


def test_one_i2v_nft_step_holds_the_first_latent_frame_clean_and_trains_on_the_rest(tmp_path):
    from _nft_local import local_trainer
    from cosmos_rl.models.generate import condition_latents
    from cosmos_rl.shapes.clips import render_clip
    from cosmos_rl.trainers import nft as nft_module

    trainer = local_trainer(_config(tmp_path, *BRIGHTNESS), tmp_path / "run")
    assert trainer.build(resume=False) == 0
    seen, losses, drawn = [], [], []
    next_batch = trainer.cursor.next_batch
    trainer.cursor.next_batch = lambda prompts: (lambda batch: drawn.extend(batch) or batch)(next_batch(prompts))
    rollout = trainer.rollout
    trainer.rollout = lambda *a: seen.append((a[-1], rollout(*a))) or seen[-1][1]
    inputs = trainer._training_inputs
    trainer._training_inputs = lambda *a: losses.append(inputs(*a)) or losses[-1]
    real_loss = nft_module.nft_math.nft_loss
    shapes = []

    def loss(v_theta, v_old, v_ref, target, *rest, **kw):
        shapes.append((tuple(v_theta.shape), tuple(target.shape)))
        return real_loss(v_theta, v_old, v_ref, target, *rest, **kw)

    nft_module.nft_math.nft_loss = loss
    try:
        metrics = trainer.train_step(1)
    finally:
        nft_module.nft_math.nft_loss = real_loss

    # the row's condition: the world's seed-0 ground-truth frame 0 of its caption, encoded (not the code under test's frame)
    (row, caption), = drawn
    frame = render_clip(caption, 0, (32, 32), FRAMES)[0]
    condition, ((x0_a, _, _), (x0_b, _, _)) = seen[0]
    assert condition.shape == (1, 4, 1, 8, 8)
    assert torch.equal(condition, condition_latents(trainer.model.vae, torch.from_numpy(frame)[None]))
    for x0 in (x0_a, x0_b):  # both ranks' rollouts start from, and keep, the condition
        assert torch.equal(x0[:, :, :1], condition), (x0[:, :, :1] - condition).abs().max()
    assert not torch.equal(x0_a[:, :, 1:], x0_b[:, :, 1:])  # the rest from each rank's own noise
    # training forwards: x_t keeps the rollout's clean frame 0, the other frames are noised
    for (x_t, t, _, target, _, _), x0 in zip(losses, (x0_a, x0_b)):
        assert torch.equal(x_t[:, :, :1], x0[:, :, :1])
        assert not torch.allclose(x_t[:, :, 1:], x0[:, :, 1:]) and target.shape[2] == LATENT_FRAMES
    # the loss sees frames 1.. only: latent frame 0 has zero weight
    assert shapes and all(v[2] == LATENT_FRAMES - 1 and tgt[2] == LATENT_FRAMES - 1 for v, tgt in shapes)
    assert metrics["train/advantage_abs_mean"] > 0 and metrics["train/grad_norm"] > 0


def test_preflight_rules_of_model_condition(tmp_path):
    base = _config(tmp_path)
    assert _errors(base) == {}
    image_run = _config(tmp_path, "model.num_frames=1", 'rl.modality="image"', 'rl.reward.name="brightness"')
    assert "this run makes images" in _errors(image_run)["model.condition.kind"]
    txt = _errors(_config(tmp_path, 'model.condition.source="image"'))["model.condition.source"]
    assert "JSONL rl.prompts.file" in txt and ".jsonl" in txt
    built_in = _errors(load.load(MANIFEST, [*TINY, 'rl.prompts.file=""']))["model.condition.source"]
    assert "built-in prompts" in built_in and "video-prompts" in built_in
    # the first-frame reward judges the world's frame: a run not conditioned on it is refused
    t2v = _errors(_config(tmp_path, 'model.condition.kind="none"', 'model.condition.source="none"'))["rl.reward.name"]
    assert "not conditioned on it" in t2v and "'shapes_video_partial'" in t2v
    # a source for an online run must be given per rollout, and every rollout is conditioned
    assert "online run generates its clips" in _errors(_config(tmp_path, 'model.condition.source="data"'))["model.condition.source"]
    assert "every rollout" in _errors(_config(tmp_path, "model.condition.probability=0.5"))["model.condition.probability"]
    unknown = _errors(_config(tmp_path, 'model.condition.kind="last_frame"'))["model.condition.kind"]
    assert "unknown condition" in unknown and "import string" in unknown


def test_the_replaced_keys_load_as_the_condition_with_one_deprecation_line(tmp_path, capsys):
    from cosmos_rl.config import legacy_keys
    from cosmos_rl.planning import plan

    legacy_keys._noted.clear()
    old_manifest = tmp_path / "old.toml"
    text = MANIFEST.read_text().replace('[model.condition]\nkind = "first_frame"', "[model.old_condition]").replace("[model.old_condition]", "")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("source = \"shapes_video\""))
    old_manifest.write_text(text.replace('algorithm = "nft"', 'algorithm = "nft"\nfirst_frame = "shapes_world"'))
    old = load.load(old_manifest, [*TINY, f'job.output_dir="{tmp_path}"'])
    load.load(old_manifest, [*TINY, f'job.output_dir="{tmp_path}"'])  # said once per process
    err = capsys.readouterr().err
    assert err.count("rl.first_frame") == 1 and '[model.condition] kind = "first_frame", source = "shapes_video"' in err
    new = load.load(MANIFEST, [*TINY, f'job.output_dir="{tmp_path}"'])
    assert old == new and plan.run_identity(old) == plan.run_identity(new)
    # the identity hashes the condition as the old key spelled it: run dirs of before resume
    assert plan.identity_fields(new)["rl.first_frame"] == "shapes_world"
    assert not any(key.startswith("model.condition") for key in plan.identity_fields(new))
    # an override of the old key is read too; a saved run's manifest says nothing
    assert load.load(MANIFEST, [*TINY, 'model.condition.kind="none"', 'model.condition.source="none"']).model.condition.kind == "none"
    saved = tmp_path / "manifest.toml"
    saved.write_text(old_manifest.read_text())
    legacy_keys._noted.clear()
    assert load.load(saved, saved_run=True).model.condition.source == "shapes_video"
    assert capsys.readouterr().err == ""


def _png(path: Path, size=32, rgb=(255, 0, 0)) -> str:
    path.write_bytes(png_bytes(rgb, size))
    return path.name


def test_the_image_column_is_read_and_bad_frames_are_refused_with_file_and_line(tmp_path):
    from cosmos_rl.data import scan
    from cosmos_rl.data.prompt_file import read_prompt_rows
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.trainers.first_frames import FirstFrames

    (tmp_path / "frames").mkdir()
    good = _png(tmp_path / "frames" / "good.png")
    (tmp_path / "frames" / "bomb.png").write_bytes(bomb_png())
    _png(tmp_path / "frames" / "small.png", size=16)
    prompts = tmp_path / "i2v.jsonl"
    rows = [{"prompt": "a red circle moving left", "image": f"frames/{good}"},
            {"prompt": "a red circle moving up", "image": "frames/missing.png"},
            {"prompt": "a red circle moving down", "image": "frames/small.png"},
            {"prompt": "a red circle staying still", "image": "frames/bomb.png"},
            {"prompt": "a red square moving left"}]  # fmt: skip
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    parsed, problems = read_prompt_rows(prompts)
    assert not problems and [r.line for r in parsed] == [1, 2, 3, 4, 5]
    assert parsed[0].image == tmp_path / "frames" / "good.png" and parsed[4].image is None

    config = _config(tmp_path, 'model.condition.source="image"', f'rl.prompts.file="{prompts}"', 'rl.reward.name="shapes_video_partial"')
    assert _errors(config) == {}
    found, _ = scan.prompt_data(config, tmp_path, full=True)
    words = [p.problem for p in found]
    assert len(words) == 4, words
    assert any(f"{prompts}:2: conditioning image not found: " in w for w in words)
    assert any(f"{prompts}:3: the conditioning image" in w and "16x16" in w and "32x32" in w for w in words)
    assert any(f"{prompts}:4" in w and "too large to decode safely" in w for w in words)
    assert any(f'{prompts}:5: no "image" field' in w for w in words)

    media = MediaSpec(frames=FRAMES, height=32, width=32, fps=24.0)
    with pytest.raises(UserError, match=f"{prompts}:2: conditioning image not found"):  # the run refuses the first bad row
        FirstFrames(Condition(kind=FIRST_FRAME, source="image"), str(prompts), media)
    prompts.write_text(json.dumps(rows[0]) + "\n")
    frames = FirstFrames(Condition(kind=FIRST_FRAME, source="image"), str(prompts), media)
    assert np.array_equal(frames.frame(0), np.asarray(Image.open(tmp_path / "frames" / good).convert("RGB")))


def test_shapes_world_rows_must_be_video_captions(tmp_path):
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.trainers.first_frames import FirstFrames

    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle moving left\na red circle\n")
    with pytest.raises(UserError, match=f"{prompts}:2: "):
        FirstFrames(Condition(kind=FIRST_FRAME, source="shapes_video"), str(prompts), MediaSpec(frames=FRAMES, height=32, width=32, fps=24.0))


def test_the_verifier_requires_frame_0_to_keep_the_conditioning_frames_objects():
    from cosmos_rl.shapes.clips import clip_layout, render_clip
    from cosmos_rl.shapes.first_frame_check import score_i2v_clips, verify_i2v_clips
    from cosmos_rl.shapes.motion_caption import parse_motion_caption

    caption = "a red circle moving left"
    spec = parse_motion_caption(caption)
    at0, at1 = (clip_layout(spec, seed, 32, FRAMES)[0].centres[0] for seed in (0, 1))
    assert max(abs(at0[0] - at1[0]), abs(at0[1] - at1[1])) > 1.6  # seed 1 starts the circle elsewhere
    clip0, clip1 = render_clip(caption, 0, 32, FRAMES), render_clip(caption, 1, 32, FRAMES)
    clips = np.stack([clip0, clip1])
    # each clip meets the caption (present + moves left); against seed 0's frame 0, only clip 0 keeps it
    same, other = verify_i2v_clips(clips, [caption] * 2, np.stack([clip0[0], clip0[0]]))
    assert (same.met, same.total, same.failures) == (3, 3, ())
    assert (other.met, other.total) == (2, 3) and "frame 0 lost the conditioning frame's red circle" in other.failures[0]
    # the rewards judge against the world's seed-0 frame: what source "shapes_video" gives a rollout
    assert score_i2v_clips(clips, [caption] * 2, "strict") == [1.0, 0.0]
    assert score_i2v_clips(clips, [caption] * 2, "partial") == [1.0, pytest.approx(2 / 3)]
    # an extra object in frame 0 fails it too
    extra = clip0.copy()
    extra[0, 26:31, 26:31] = (0, 0, 255)
    (verdict,) = verify_i2v_clips(extra[None], [caption], clip0[0][None])
    assert any("frame 0 has a blue square" in f for f in verdict.failures)


def test_the_shipped_i2v_manifest_validates_and_plans():
    from cosmos_rl.planning import plan

    config = load.load(MANIFEST)
    assert (config.model.condition.kind, config.model.condition.source) == ("first_frame", "shapes_video") and config.model.num_frames == 9
    assert _errors(config) == {}
    built = plan.build(config, str(MANIFEST))
    assert built["per_step"]["train_activation_mib_per_rank"] > 0
