"""Suites (`cosmos_rl.suites`): the registry (built-in names, import strings, the one-line error for an
unknown name), the built-in shapes suites registering exactly the rewards the service served before
(the same names and the same scores as the world's own functions on hand-made images and clips),
what the suites answer (held-out prompts, verifier, given frames), the preflight rules on
`rl.eval.suite`, and a suite from outside the package (tests/standin_suite.py, a flat-colour world)
that evaluates through `cosmos-rl eval --suite` and rewards and evaluates a 2-step NFT run on Ray,
with no edit under cosmos_rl/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _inproc import cosmos

from cosmos_rl.config import load, preflight
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import scores_by_task

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SMOKE = ROOT / "manifests" / "nft_t2i_smoke.toml"
STANDIN = "standin_suite:SUITE"
# The clip and image rewards the built-in service offered before suites had names (rewards/functions.py
# and rewards/video.py then): each must stay registered under its name.
OLD_IMAGE_REWARDS = ("shapes_strict", "shapes_partial")
OLD_CLIP_REWARDS = ("shapes_video_strict", "shapes_video_partial", "shapes_video_i2v_strict", "shapes_video_i2v_partial")

# What a target makes: 32x32 images, or 9-frame clips of them.
IMAGE = MediaSpec.image(32)
CLIP = MediaSpec(frames=9, height=32, width=32)


def _env() -> dict[str, str]:
    """The environment of a subprocess that imports the stand-in suite by module name, as a user's own
    suite module must be importable by every process."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}


# ------------------------------------------------------------------------------------ registry
def test_an_unknown_suite_is_one_line_naming_the_known_suites():
    with pytest.raises(suites.UnknownSuite) as caught:
        suites.get("shape")
    message = str(caught.value)
    assert message == ("unknown suite 'shape'; use one of shapes, shapes_video, pusht, lerobot "
                       "(or package.module:SUITE, a suite outside the package)") and "\n" not in message  # fmt: skip
    with pytest.raises(suites.UnknownSuite, match=r"cannot import suite 'no_such_module_xyz:SUITE' \(No module named"):
        suites.get("no_such_module_xyz:SUITE")
    with pytest.raises(suites.UnknownSuite, match=r"'standin_suite:TASKS' is not a cosmos_rl.suites.base.Suite \(got tuple\)"):
        suites.get("standin_suite:TASKS")


def test_an_import_string_names_a_suite_outside_the_package_and_its_rewards():
    suite = suites.get(STANDIN)
    assert suites.get(STANDIN) is suite and STANDIN in suites.names()
    # The manifest's spelling is its name, and its rewards' names carry it.
    assert suite.name == STANDIN and suite.title == "flat-colour"
    assert suite.reward_names() == [f"{STANDIN}/colour_match", f"{STANDIN}/colour_fraction"]
    assert suite.default_reward == f"{STANDIN}/colour_match"
    assert suites.reward_owner(f"{STANDIN}/colour_fraction") is suite
    assert suites.reward_owner("brightness") is None  # weight-free: no suite's
    with pytest.raises(suites.UnknownSuite, match=f"suite '{STANDIN}' registers no reward '{STANDIN}/nope'; use one of"):
        suites.reward_owner(f"{STANDIN}/nope")
    # A colour world: "a green image" is primary, anything else is outside its grammar.
    assert suite.task_of("a green image") == "primary" and suite.task_of("A Yellow image") == "secondary"
    with pytest.raises(ValueError, match="not 'a COLOUR image'"):
        suite.task_of("a red circle")


def test_the_built_in_suites_register_the_rewards_served_before_under_their_names():
    from cosmos_rl.rewards.registry import builtin_rewards
    from cosmos_rl.rewards.functions import REWARDS

    assert suites.names()[:2] == ["shapes", "shapes_video"]
    assert suites.builtin_reward_names(clips=False) == list(OLD_IMAGE_REWARDS)
    # the episode suites' rewards of window keys come after them: pusht's (forward dynamics, then policy's chunk reward), then lerobot's
    world, dataset = ["pusht_forward_strict", "pusht_forward_partial", "pusht_chunk_coverage"], ["prediction_psnr", "prediction_ssim"]
    assert suites.builtin_reward_names(clips=True) == [*OLD_CLIP_REWARDS, *world, *dataset]
    served = builtin_rewards()
    assert set(served) == {*REWARDS, *OLD_IMAGE_REWARDS, *OLD_CLIP_REWARDS, *world, *dataset}
    assert all(served[name].modalities == ("video",) and suites.reward_owner(name).name == "pusht" for name in world)
    assert [name for name in served if served[name].takes_actions] == ["pusht_chunk_coverage"]  # handed each clip's action rows
    assert all(served[name].modalities == ("video",) and suites.reward_owner(name).name == "lerobot" for name in dataset)
    for name in OLD_IMAGE_REWARDS:
        r = served[name]
        assert (r.modalities, r.max_batch, r.revision, r.uses_prompt) == (("image",), 256, f"{name}:builtin-1", True)
    for name in OLD_CLIP_REWARDS:
        r = served[name]
        assert (r.modalities, r.max_batch, r.revision, r.uses_prompt) == (("video",), 32, f"{name}:builtin-1", True)
    assert suites.reward_owner("shapes_partial").name == "shapes" and suites.reward_owner("shapes_video_i2v_strict").name == "shapes_video"
    assert [r.name for r in suites.get("shapes_video").rewards if r.given_frame] == ["shapes_video_i2v_strict", "shapes_video_i2v_partial"]


def test_the_built_in_rewards_score_hand_made_images_as_the_worlds_own_functions():
    from cosmos_rl.rewards.registry import builtin_rewards
    from cosmos_rl.shapes import parse_caption, render, shapes_partial, shapes_strict

    served = builtin_rewards()
    captions = ["a red circle", "two blue squares", "a green triangle"]
    drawn = np.stack([render(parse_caption(c), 0) for c in captions])
    images = drawn.copy()
    images[1] = drawn[0]  # the second image shows a red circle, not two blue squares
    images[2, :, :16] = images[2, 0, 0]  # the left half painted with the background
    for name, world in (("shapes_strict", shapes_strict), ("shapes_partial", shapes_partial)):
        assert served[name].fn(images, captions) == world(images, captions)
    assert served["shapes_strict"].fn(drawn, captions) == [1.0, 1.0, 1.0]
    assert served["shapes_strict"].fn(images, captions)[:2] == [1.0, 0.0]


def test_the_built_in_clip_rewards_score_hand_made_clips_as_the_worlds_own_functions():
    from cosmos_rl.rewards.registry import builtin_rewards
    from cosmos_rl.shapes import render_clip, score_clips
    from cosmos_rl.shapes.first_frame_check import score_i2v_clips

    served = builtin_rewards()
    captions = ["a red square moving left", "two green circles moving up"]
    truth = np.stack([render_clip(c, 0, (32, 32), 9) for c in captions])
    clips = truth.copy()
    clips[0] = clips[0][::-1]  # played backwards: it moves right
    clips[1] = np.stack([render_clip(captions[1], 3, (32, 32), 9)[0]] * 9)  # another start, standing still
    for samples in (truth, clips):
        for mode in ("strict", "partial"):
            assert served[f"shapes_video_{mode}"].fn(samples, captions) == score_clips(samples, captions, mode)
            assert served[f"shapes_video_i2v_{mode}"].fn(samples, captions) == score_i2v_clips(samples, captions, mode)
    assert served["shapes_video_strict"].fn(truth, captions) == [1.0, 1.0]
    assert served["shapes_video_strict"].fn(clips, captions) == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"\[N, F, H, W, 3\]"):
        served["shapes_video_strict"].fn(truth[0], captions)


# ------------------------------------------------------------------------------ what a suite answers
def test_the_shapes_suites_answer_from_the_world():
    from cosmos_rl.shapes import MOTION_TASKS, TASKS, render_clip, scores_by_task as world_by_task, split_motion_prompts
    from cosmos_rl.shapes.first_frame_check import world_first_frames

    shapes, video = suites.get("shapes"), suites.get("shapes_video")
    assert shapes.tasks == TASKS and video.tasks == MOTION_TASKS
    assert (shapes.preset, video.preset) == ("shapes", "shapes_video") and suites.of_preset("shapes_video") is video
    assert suites.of_preset("tiny") is None
    assert (shapes.media, video.media) == (MediaSpec.image(32), MediaSpec(frames=9, height=32, width=32))
    # One held-out prompt per task: the middle one of each task's held-out list of the split at seed 0.
    split = split_motion_prompts(0)
    assert video.held_out(1) == [(split.held_out[t][len(split.held_out[t]) // 2].caption(), t) for t in MOTION_TASKS]
    captions = ["a circle", "a square", "two circles"]
    assert scores_by_task(shapes, captions, [1, 0, 1]) == world_by_task(captions, [1, 0, 1]) == {"single_object": 0.5, "counting": 1.0}
    # The given frames: the world's frame 0 at its own seed (what the I2V rewards judge), or at each caption's.
    media = MediaSpec(frames=5, height=32, width=32)
    moving = ["a red square moving left", "a blue circle moving up"]
    assert np.array_equal(video.given_frames(moving, media), world_first_frames(moving, 32, 32, 5))
    at_seeds = video.given_frames(moving, media, [2, 3])
    assert all(np.array_equal(at_seeds[i], render_clip(c, s, (32, 32), 5)[0]) for i, (c, s) in enumerate(zip(moving, [2, 3])))
    assert not shapes.gives_frames
    with pytest.raises(ValueError, match="suite 'shapes' gives no first frames"):
        shapes.given_frames(captions, MediaSpec.image(32))
    # A rewording is one canonical spelling in either grammar.
    assert shapes.canonical("a square and a circle") == shapes.canonical("a circle and a square")


def test_reading_the_suites_and_their_rewards_imports_no_world():
    """validate reads every suite's names, media and rewards: none of it may import a world (numpy) or torch."""
    code = (
        "import sys\n"
        "from cosmos_rl.suites import registry\n"
        "print(registry.builtin_reward_names(), [s.media.frames for s in registry.builtin_suites()])\n"
        "print(sorted(m for m in ('numpy', 'torch', 'cosmos_rl.shapes') if m in sys.modules))\n"
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


# ---------------------------------------------------------------------------------- preflight
def _problems(*overrides: str) -> dict[str, str]:
    config = load.load(SMOKE, ["rl.eval.every=10", *overrides])
    return {p.path: p.render() for p in preflight.check(config, SMOKE.parent) if p.severity == "error"}


def test_preflight_holds_rl_eval_suite_to_a_known_suite_of_the_runs_media():
    found = _problems('rl.eval.suite="shape"')
    assert "unknown suite 'shape'" in found["rl.eval.suite"] and "shapes, shapes_video" in found["rl.eval.suite"]
    found = _problems('rl.eval.suite="shapes_video"')
    assert "judges clips, and this run makes images" in found["rl.eval.suite"]
    found = _problems(f'rl.eval.suite="{STANDIN}"')  # rl.eval.reward left at shapes_strict
    assert f"is a reward of the suite 'shapes', and rl.eval.suite names '{STANDIN}'" in found["rl.eval.reward"]
    assert f"{STANDIN}/colour_match" in found["rl.eval.reward"]
    assert "rl.eval.suite" not in _problems(f'rl.eval.suite="{STANDIN}"', f'rl.eval.reward="{STANDIN}/colour_fraction"')
    assert not _problems(f'rl.eval.suite="{STANDIN}"', 'rl.eval.reward="brightness"')  # a weight-free reward on its prompts
    found = _problems(f'rl.reward.name="{STANDIN}/nope"')
    assert f"registers no reward '{STANDIN}/nope'" in found["rl.reward.name"]
    assert "rl.reward.name" not in _problems(f'rl.reward.name="{STANDIN}/colour_fraction"')


# ------------------------------------------------------------------------------------ pairs mine
def test_pairs_mine_asks_the_rewards_suite_what_it_may_rank():
    from cosmos_rl.commands.mining.command import _finer
    from cosmos_rl.commands.mining.scoring import check_reward, clip_rewards, ranks_by, scoring_suite
    from cosmos_rl.core.errors import UserError

    assert clip_rewards() == ["shapes_video_strict", "shapes_video_partial"]  # text to video: no given frame
    assert [ranks_by(r) for r in ("shapes_strict", "shapes_video_partial", "brightness", f"{STANDIN}/colour_fraction")] == [
        "score", "partial", "score", "partial"]  # fmt: skip
    # An image suite's reward on clips counts under its clip suite's tasks; a weight-free one under the image suite's.
    assert [scoring_suite(r, 9).name for r in ("shapes_partial", "shapes_video_strict", "brightness")] == ["shapes_video", "shapes_video", "shapes"]
    check_reward(f"{STANDIN}/colour_match", IMAGE, None, "TARGET 'x'")  # an outside image suite's reward ranks images
    with pytest.raises(UserError, match="pusht_forward_strict: judges a world model's clips .* samples are of captions; mine it alone on a file of window keys"):
        check_reward("pusht_forward_strict", MediaSpec(frames=9, height=32, width=32, fps=10.0), None, "TARGET 'x'")
    with pytest.raises(UserError, match=f"--reward {STANDIN}/colour_match: scores images, and TARGET 'x' makes 5-frame clips; pass --frame-reduce"):
        check_reward(f"{STANDIN}/colour_match", MediaSpec(frames=5, height=32, width=32), None, "TARGET 'x'")
    with pytest.raises(UserError, match="--reward shapes_video_i2v_partial: judges image-to-video clips, .* use shapes_video_partial"):
        check_reward("shapes_video_i2v_partial", MediaSpec(frames=5, height=32, width=32), None, "TARGET 'x'")
    # The hint when every row tied, as it read before suites had names (and a partial reward of the suite otherwise).
    assert _finer("shapes_strict", IMAGE, None) == "use a finer reward (e.g. shapes_partial)"
    assert _finer("shapes_partial", IMAGE, None) == "mine a model whose samples it tells apart"
    assert _finer("brightness", CLIP, "mean") == "use a finer reward (e.g. shapes_partial --frame-reduce mean)"
    assert _finer("shapes_video_strict", CLIP, None) == "use shapes_video_partial, or score frame by frame (--reward shapes_partial --frame-reduce mean)"
    assert _finer("shapes_video_partial", CLIP, None) == "score frame by frame (--reward shapes_partial --frame-reduce mean)"
    assert _finer(f"{STANDIN}/colour_match", IMAGE, None) == f"use a finer reward (e.g. {STANDIN}/colour_fraction)"


# ----------------------------------------------------------------------------- the stand-in suite
def test_the_stand_in_suite_scores_an_evaluation_exactly():
    """Seed 0 draws each caption's colour exactly (verifier: 1), seed 1 a grey image (0)."""
    from cosmos_rl.config.sampler import default_settings
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.evaluation.prompts import held_out_captions
    from standin_suite import _RGB, parse

    suite = suites.get(STANDIN)
    captions = held_out_captions(suite, 0)
    assert captions == ["a red image", "a green image", "a blue image", "a cyan image", "a magenta image", "a yellow image"]
    vae = SimpleNamespace(config=SimpleNamespace(scale_factor_spatial=4))
    evaluator = Evaluator(captions, 2, suite.default_reward, default_settings(), tokenizer=None, vae=vae,
                          media=MediaSpec.image(32), latent_shape=(4, 1, 8, 8), device=None)  # fmt: skip
    assert evaluator.suite is suite
    grey = np.full((32, 32, 3), 128, np.uint8)
    evaluator.sample = lambda transformer, items: np.stack(
        [np.full((32, 32, 3), _RGB[parse(i.caption)[0]], np.uint8) if i.seed == 0 else grey for i in items]
    )
    scores = evaluator.evaluate(None)
    assert scores.tasks == {"primary": 0.5, "secondary": 0.5} and scores.tasks_partial == scores.tasks and scores.score == 0.5
    metrics = scores.metrics()
    assert metrics["eval/task/primary"] == 0.5 and metrics["eval/score_partial"] == 0.5


def test_cosmos_rl_eval_evaluates_a_model_in_the_stand_in_suite(tmp_path):
    # In-process (tests/_inproc.py): the JSON and the refusal are the subject; tests/ is on this
    # process's sys.path, so the stand-in suite imports by module name here as in a child given _env().
    args = ["eval", "preset:tiny", "--suite", STANDIN, "--per-task", "1", "--seeds", "1", "--sample-steps", "2", "--device", "cpu",
            "--json", "--out", str(tmp_path / "e")]  # fmt: skip
    done = cosmos(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["suite"] == STANDIN and out["reward"] == f"{STANDIN}/colour_match"
    assert out["n_prompts"] == 2 and out["prompts"] == "flat-colour held-out prompts, up to 1 per task"
    assert out["grid_prompts"] == ["a green image", "a magenta image"]  # the middle colour of each task
    assert set(out["tasks"]) == set(out["tasks_partial"]) == {"primary", "secondary"}
    assert all(0.0 <= v <= 1.0 for v in [*out["tasks"].values(), *out["tasks_partial"].values()])
    # Without --suite a model names none: one line, no traceback.
    done = cosmos(*args[:2], *args[4:], cwd=tmp_path)
    assert done.returncode == 2 and "a model that names no suite to evaluate in" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_stand_in_suite_rewards_and_evaluates_a_two_step_nft_run(tmp_path, ray_cluster):
    """Rewarded by the stand-in's partial reward (the built-in service imports the suite) and
    evaluated at step 2 on its held-out prompts (every actor imports it); `cosmos-rl eval RUN_DIR`
    then evaluates the run in its own suite."""
    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.commands.evaluate import run_eval

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red image\na blue image\na cyan image\na yellow image\n")
    overrides = [
        "rl.max_steps=2", "rl.group_size=2", "rl.prompts_per_step=2", "rl.sample_steps=4", "rl.timesteps_per_sample=2",
        "rl.sample_grid_every=0", "job.progress=false", "checkpoint.every=2", "checkpoint.keep=0",
        f'rl.prompts.file="{prompts}"', f'rl.reward.name="{STANDIN}/colour_fraction"', 'rl.reward.revision="builtin-v1"',
        "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", "rl.eval.sample_steps=2",
        f'rl.eval.suite="{STANDIN}"', f'rl.eval.reward="{STANDIN}/colour_match"',
        f'job.output_dir="{tmp_path}"', 'job.name="standin"',
    ]  # fmt: skip
    config = load.load(SMOKE, overrides)
    assert [p for p in preflight.check(config, SMOKE.parent) if p.severity == "error"] == []
    assert launch.train(config, SMOKE, Console(stderr=True)) == 0
    run_dir = tmp_path / "standin"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= row["train/reward_mean"] <= 1.0 for row in rows)  # the fraction of pixels of the named colour
    evaluated = rows[1]  # rl.eval.every = 2: the stand-in's tasks, strict and partial
    assert {"eval/score", "eval/score_partial", "eval/task/primary", "eval/task/secondary", "eval/task_partial/secondary"} <= set(evaluated)
    assert sorted(k for k in evaluated if k.startswith("eval/task/")) == ["eval/task/primary", "eval/task/secondary"]
    result = run_eval(str(run_dir), seeds=1, per_task=1, sample_steps=2, out_dir=tmp_path / "eval", device="cpu")
    assert result["suite"] == STANDIN and result["reward"] == f"{STANDIN}/colour_match"
    assert set(result["tasks"]) == set(result["base_tasks"]) == {"primary", "secondary"}
