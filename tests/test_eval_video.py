"""`cosmos-rl eval` on video: moving-shapes held-out prompts, the video verifier per task, image-to-
video from the ground-truth first frame, and the frame-strip PNG plus animated GIF."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _video_folders import video_nano_folder
from PIL import Image

from cosmos_rl.core.errors import UserError
from cosmos_rl.commands.evaluate import run_eval
from cosmos_rl.shapes.clips import render_clip
from cosmos_rl.shapes.motion_spec import MOTION_TASKS

FAST = dict(seeds=1, per_task=1, sample_steps=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(video_nano_folder(tmp_path_factory.mktemp("video_eval") / "pipe", seed=6))


@pytest.mark.parametrize("i2v", [False, True])
def test_a_video_model_is_scored_per_motion_task_with_strips_and_a_gif(folder, tmp_path, i2v):
    result = run_eval(folder, suite="shapes_video", frames=5, out_dir=tmp_path, condition="first_frame" if i2v else None, **FAST)
    assert result["reward"] == "shapes_video_strict" and result["frames"] == 5 and result["i2v"] is i2v
    assert set(result["tasks"]) == set(MOTION_TASKS) and result["n_images"] == len(MOTION_TASKS)
    assert result["score_interval"] is not None and result["tasks_partial"] is not None
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["grid_gif"] == str(tmp_path / "samples.gif")
    with Image.open(tmp_path / "samples.gif") as gif:
        assert gif.n_frames == 5  # one sheet per frame of the clips
    with Image.open(tmp_path / "samples.png") as strips:
        assert strips.width > 5 * 128 and strips.height > len(MOTION_TASKS) * 128  # one upscaled strip per prompt


def test_image_to_video_holds_the_ground_truth_first_frame(folder):
    from cosmos_rl.core.condition import FIRST_FRAME, Condition
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.models.build import load_parts
    from cosmos_rl.models.generate import condition_latents
    from cosmos_rl.core.media import MediaSpec, latent_shape
    from cosmos_rl.models.sampler_settings import SamplerSettings

    parts = load_parts(folder, skip_keys=["audio_*", "action_*"])
    media = MediaSpec(frames=5, height=32, width=32)
    captions = ["a red square moving left", "two green circles moving up"]
    evaluator = Evaluator(captions, 2, "shapes_video_strict", SamplerSettings(2, None, 1.0), tokenizer=parts.tokenizer,
                          vae=parts.vae, media=media, latent_shape=latent_shape(media, parts.vae.config, parts.transformer.config),
                          device=torch.device("cpu"), model_parts=parts, condition=Condition(kind=FIRST_FRAME, source="shapes_video"))  # fmt: skip
    item = evaluator.items[3]  # the second caption under seed 1
    assert evaluator.suite.name == "shapes_video"  # the reward's own suite gives the frames
    assert np.array_equal(evaluator.first_frames([item])[0], render_clip(item.caption, 1, (32, 32), 5)[0])
    expected = condition_latents(parts.vae, torch.from_numpy(render_clip(item.caption, 1, (32, 32), 5)[:1]))
    assert torch.equal(evaluator.condition([item]), expected)


def test_video_options_that_cannot_be_honoured_are_refused(folder, tmp_path):
    with pytest.raises(UserError, match="--frames: a clip has 4k \\+ 1 frames"):
        run_eval(folder, frames=8, out_dir=tmp_path, **FAST)
    with pytest.raises(UserError, match="--condition first_frame: .* makes images"):
        run_eval("preset:tiny", suite="shapes", condition="first_frame", out_dir=tmp_path, **FAST)
    with pytest.raises(UserError, match="--condition: unknown condition 'last_frame'"):
        run_eval(folder, suite="shapes_video", frames=5, condition="last_frame", out_dir=tmp_path, **FAST)
    with pytest.raises(UserError, match="not a built-in clip reward"):
        run_eval(folder, suite="shapes_video", frames=5, reward="brightness", out_dir=tmp_path, **FAST)
    with pytest.raises(UserError, match=r"suite shapes: judges images, and .* makes 5-frame clips"):
        run_eval(folder, frames=5, reward="shapes_strict", out_dir=tmp_path, **FAST)
    # A model folder names no suite; given one, its size and frames are the suite's unless flags say otherwise.
    with pytest.raises(UserError, match="a model that names no suite"):
        run_eval(folder, frames=5, out_dir=tmp_path, **FAST)
