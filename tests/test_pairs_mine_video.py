"""`cosmos-rl pairs mine` on a clip target: 5-frame clips of the shapes base (`--frames 5`, its
image VAE: every frame its own latent frame) sampled per prompt, ranked, and written as mp4 clip
pairs the video DPO reader takes; the video verifier's ranking with clips whose verdicts are known;
and the one-line refusals of a reward that cannot rank the target's samples."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.cli import app
from cosmos_rl.data.tar_pairs import TarShardPairs
from cosmos_rl.commands.mining.command import run_mine
from cosmos_rl.shapes import verify
from cosmos_rl.shapes.clips import render_clip
from cosmos_rl.shapes.motion_caption import motion_task_of
from cosmos_rl.shapes.motion_verifier import frame_captions, verify_clips

FRAMES = 5
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["a blue square staying still", "a red circle moving right", "two yellow circles moving up"]


def _prompts(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(rows) + "\n")
    return path


def _metas(shard: str) -> list[dict]:
    with tarfile.open(shard) as tar:
        names = [m.name for m in tar.getmembers()]
        metas = [json.loads(tar.extractfile(name).read()) for name in names if name.endswith(".json")]
    assert sorted(n.split(".", 1)[1] for n in names) == sorted(["json", "winner.mp4", "loser.mp4"] * len(metas))
    return metas


def _clip(side) -> np.ndarray:
    """A decoded [3, F, H, W] side in [0, 1] as the uint8 [F, H, W, 3] clip that was written."""
    return (side.permute(1, 2, 3, 0).numpy() * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    """Three prompts x three 5-frame clips, 3 sampler steps, ranked by the image verifier's partial
    score frame by frame (mean over frames, each frame against the caption's static part)."""
    tmp_path = tmp_path_factory.mktemp("mine_clips")
    return tmp_path, run_mine(
        "preset:shapes", frames=FRAMES, reward="shapes_partial", frame_reduce="mean", prompts=_prompts(tmp_path, PROMPTS),
        samples=3, out_dir=tmp_path / "pairs", device="cpu", sample_steps=3, guidance=1.0,
    )  # fmt: skip


def test_clips_mined_frame_by_frame_are_clip_pairs_the_dpo_clip_reader_takes(mined):
    tmp_path, summary = mined
    assert summary["frames"] == FRAMES and summary["fps"] == 24.0 and summary["ranked_by"] == "partial"
    assert summary["rows"] == 3 and summary["pairs"] + summary["ties_dropped"] == 3 and summary["pairs"] >= 1
    assert json.loads((tmp_path / "pairs" / "mine.json").read_text()) == summary
    pairs = TarShardPairs(summary["shards"], MediaSpec(FRAMES, 32, 32))
    assert len(pairs) == summary["pairs"]
    for index, meta in enumerate(_metas(summary["shards"][0])):
        pair, sides = pairs[index], pairs.prompt_sides()[index]
        # One prompt for both clips: the row's caption, no per-side prompt.
        assert pair.prompt == meta["prompt"] and meta["prompt"] in PROMPTS and (sides.winner_prompt, sides.loser_prompt) == (None, None)
        assert pair.winner.shape == pair.loser.shape == (3, FRAMES, 32, 32)
        assert meta["winner_score"] >= meta["loser_score"] and meta["winner_score"] > meta["loser_score"]
        assert (meta["winner_score"], meta["loser_score"]) == (max(meta["scores"]), min(meta["scores"]))
        # The decoded clips (lossless mp4) re-scored frame by frame give the recorded scores.
        static = frame_captions([meta["prompt"]])[0]
        for side, score in ((pair.winner, meta["winner_score"]), (pair.loser, meta["loser_score"])):
            frames = _clip(side)
            assert np.mean([v.partial for v in verify(frames, [static] * FRAMES)]) == pytest.approx(score, abs=1e-12)


def test_the_shipped_clip_dpo_manifest_trains_on_mined_clip_pairs_and_its_run_mines_again(mined, tmp_path):
    """manifests/dpo_video_shapes_cpu.toml at 5 frames on the pairs above: preflight passes and one
    step takes a real LoRA gradient (the full recipe's 9 frames only make each clip longer); the
    run directory is then a clip target that samples at its own model.num_frames."""
    import math

    import torch

    from cosmos_rl.config import load, preflight
    from cosmos_rl.core.errors import UserError
    from cosmos_rl.trainers.dpo import DPOTrainer

    _, summary = mined
    overrides = [f"model.num_frames={FRAMES}", f"rl.data.shards={json.dumps(summary['shards'])}", f'job.output_dir="{tmp_path}"',
                 "rl.max_steps=1", "rl.pairs_per_step=1", "rl.eval.every=0", "checkpoint.keep=0", "job.progress=false"]  # fmt: skip
    config = load.load(ROOT / "manifests" / "dpo_video_shapes_cpu.toml", overrides)
    assert [p.render() for p in preflight.check(config) if p.severity == "error"] == []
    row = DPOTrainer(config, tmp_path / "run", torch.device("cpu")).run()[-1]
    assert row["train/loss"] == pytest.approx(math.log(2), abs=1e-6)  # the policy starts as the reference
    assert math.isfinite(row["train/grad_norm"]) and row["train/grad_norm"] > 0
    (tmp_path / "run" / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")  # as `cosmos-rl train` saves it
    again = run_mine(str(tmp_path / "run"), reward="shapes_partial", frame_reduce="mean", prompts=_prompts(tmp_path, PROMPTS),
                     samples=3, out_dir=tmp_path / "again", device="cpu", sample_steps=3, guidance=1.0)  # fmt: skip
    assert (again["kind"], again["step"], again["frames"]) == ("run", 1, FRAMES)
    assert len(TarShardPairs(again["shards"], MediaSpec(FRAMES, 32, 32))) == again["pairs"] >= 1
    with pytest.raises(UserError, match=f"--frames 9: the run .* trains at model.num_frames = {FRAMES}; drop --frames"):
        run_mine(str(tmp_path / "run"), reward="shapes_video_partial", frames=9, prompts=_prompts(tmp_path, PROMPTS), samples=3,
                 out_dir=tmp_path / "no", device="cpu")  # fmt: skip


def test_the_video_verifier_ranks_the_clip_that_moves_as_its_caption_says_above_frozen_ones(tmp_path, monkeypatch):
    """The shapes base's own clips all score 0 with the video verifier (ties, no pair), so the
    sampler is replaced by one whose clips have known verdicts: sample 1 of every row is the world's
    ground-truth clip (strict 1.0), samples 0 and 2 its first frame held still (the motion unmet)."""
    from cosmos_rl.evaluation.evaluator import Evaluator

    def sample(self, transformer, items):
        clips = []
        for item in items:
            truth = render_clip(item.caption, 0, 32, FRAMES)
            clips.append(truth if item.seed == 1 else np.repeat(truth[:1], FRAMES, axis=0))
        return np.stack(clips)

    monkeypatch.setattr(Evaluator, "sample", sample)
    moving = PROMPTS[1:]
    summary = run_mine("preset:shapes", frames=FRAMES, reward="shapes_video_partial", prompts=_prompts(tmp_path, moving),
                       samples=3, out_dir=tmp_path / "pairs", device="cpu")  # fmt: skip
    assert summary["pairs"] == 2 and summary["ties_dropped"] == 0
    pairs = TarShardPairs(summary["shards"], MediaSpec(FRAMES, 32, 32))
    for index, meta in enumerate(_metas(summary["shards"][0])):
        assert (meta["winner_sample"], meta["winner_score"], meta["strict"][1]) == (1, 1.0, 1.0)
        assert meta["loser_score"] < 1.0 and meta["loser_sample"] == 0 and meta["task"] == motion_task_of(meta["prompt"])
        pair = pairs[index]
        assert pair.prompt == moving[index] == meta["prompt"]
        assert np.array_equal(_clip(pair.winner), render_clip(meta["prompt"], 0, 32, FRAMES))
        verdicts = verify_clips(np.stack([_clip(pair.winner), _clip(pair.loser)]), [meta["prompt"]] * 2)
        assert [v.partial for v in verdicts] == [meta["winner_score"], meta["loser_score"]]


@pytest.mark.parametrize("extra, needle", [
    (["--reward", "shapes_video_partial"], "--reward shapes_video_partial: scores whole clips, and TARGET 'preset:shapes' makes images (1 frame); use shapes_partial"),
    (["--reward", "brightness", "--frame-reduce", "mean"], "--frame-reduce mean: TARGET 'preset:shapes' makes images (1 frame)"),
    (["--frames", "5", "--reward", "brightness"], "--reward brightness: scores images, and TARGET 'preset:shapes' makes 5-frame clips; pass --frame-reduce"),
    (["--frames", "5", "--reward", "shapes_video_i2v_strict"], "pairs mine samples text to video; use shapes_video_strict"),
    (["--frames", "5", "--reward", "shapes_video_strict", "--frame-reduce", "min"], "--frame-reduce min: plays no part"),
    (["--frames", "5", "--reward", "brightness", "--frame-reduce", "median"], "--frame-reduce: 'median' is not a reducer; use one of mean, min, first, last"),
    (["--frames", "5", "--reward", "nope"], "--reward: 'nope' is not a built-in reward; TARGET 'preset:shapes' makes 5-frame clips"),
    (["--frames", "4", "--reward", "shapes_video_strict"], "--frames: a clip has 4k + 1 frames"),
])  # fmt: skip
def test_a_reward_that_cannot_rank_the_targets_samples_is_a_one_line_error(tmp_path, extra, needle):
    args = ["pairs", "mine", "preset:shapes", "--prompts", str(_prompts(tmp_path, PROMPTS)), "--out", str(tmp_path / "x"), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()  # refused before anything is written
