"""A condition defined outside the package (tests/standin_conditions.py) works through `train` and
`eval` with no edit under cosmos_rl/: named by an import string in `[model.condition]`, it gives a
clip's leading frames, which generation holds clean and the loss leaves out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_rl.core.condition import Condition, UnknownCondition, kind_named
from cosmos_rl.core.media import MediaSpec

TESTS = Path(__file__).resolve().parent


def test_an_import_string_names_a_condition_kind(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    kind = kind_named("standin_conditions:FIRST_FIVE")
    assert (kind.name, kind.given_frames) == ("first_five", 5)
    # 9 frames through a VAE that halves time: 5 latent frames, the first 5 pixel frames are 3 of them
    assert kind.clean_latent_frames(MediaSpec(frames=9, height=32, width=32), 2) == 3
    with pytest.raises(ValueError, match="nothing left to generate"):
        kind.clean_latent_frames(MediaSpec(frames=5, height=32, width=32), 2)
    with pytest.raises(UnknownCondition, match="cannot import it"):
        kind_named("standin_conditions:MISSING")
    with pytest.raises(UnknownCondition, match="not a cosmos_rl.core.condition.ConditionKind"):
        kind_named("standin_conditions:ConditionKind")
    with pytest.raises(ValueError, match="has a source exactly when it gives frames"):
        Condition(kind=kind, source="none")


def test_the_given_leading_frames_are_the_first_latent_frames_of_the_whole_clip():
    """The Wan encoder is causal in time: the latents of the first five frames alone are the first
    three latent frames of the whole nine-frame clip's, so a continued clip holds exactly those."""
    from cosmos_rl.models.generate import condition_latents, encode_pixels
    from cosmos_rl.models.shapes_video_preset import build_shapes_video
    from cosmos_rl.shapes.clips import render_clip

    parts = build_shapes_video(with_extra_heads=False)
    clip = render_clip("a red circle moving left", 0, (32, 32), 9)  # uint8 [9, 32, 32, 3]
    given = condition_latents(parts.vae, torch.from_numpy(clip[:5])[None])
    whole = encode_pixels(parts.vae, MediaSpec(frames=9, height=32, width=32), torch.from_numpy(clip).permute(3, 0, 1, 2)[None].float() / 255)
    assert given.shape == (1, 4, 3, 8, 8)
    torch.testing.assert_close(given, whole[:, :, :3], atol=2e-5, rtol=0)


@pytest.mark.slow
def test_a_stand_in_condition_trains_and_evaluates_through_the_cli(shipped_manifests, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}  # fmt: skip

    def cosmos(*args):
        done = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", *args], cwd=shipped_manifests.parent, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    manifest = shipped_manifests / "sft_video_shapes_cpu.toml"
    cosmos("train", str(manifest), 'model.condition.kind="standin_conditions:FIRST_FIVE"', "model.condition.probability=1.0",
           "rl.samples_per_step=2", "rl.max_steps=2", "rl.eval.every=2", "job.log_every=1", "rl.eval.per_task=1", "rl.eval.seeds=1",
           "rl.eval.sample_steps=2", "checkpoint.every=0", "rl.optimizer.warmup_steps=0", f'job.output_dir="{tmp_path}"',
           'job.name="cont"')  # fmt: skip
    run = tmp_path / "cont"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/first_frame_conditioned"] == 1.0 for r in rows)
    assert "eval/score" in rows[1]
    assert 'kind = "standin_conditions:FIRST_FIVE"' in (run / "manifest.toml").read_text()
    done = cosmos("eval", str(run), "--json", "--per-task", "1", "--seeds", "1", "--sample-steps", "2", "--out", str(tmp_path / "ev"))
    result = json.loads(done.stdout)
    assert result["i2v"] is True and result["frames"] == 9 and np.isfinite(result["score"])
