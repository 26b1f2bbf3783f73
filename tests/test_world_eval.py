"""`cosmos-rl eval` in an episode suite (pusht): the held-out windows, the verdict per mode at the
scoring seam (ground truth scores 1.0; hand-worked action errors), the paired change, and an
end-to-end evaluation of a tiny Nano-layout folder with action heads through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _video_folders import world_nano_folder
from PIL import Image
from typer.testing import CliRunner

from cosmos_rl.cli import app
from cosmos_rl.core.condition import Condition, kind_named
from cosmos_rl.core.media import MediaSpec, latent_shape
from cosmos_rl.evaluation.scores import difference
from cosmos_rl.evaluation.world import WorldEvaluator
from cosmos_rl.models.build import load_parts
from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.pusht.verifier import agent_tolerance_px
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.pusht import SPLIT_SEED

FRAMES, SIZE = 5, 32  # a chunk of 4 actions; the folder's VAE makes 2 latent frames of 8x8
MEDIA = MediaSpec(frames=FRAMES, height=SIZE, width=SIZE, fps=10.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return world_nano_folder(tmp_path_factory.mktemp("world_eval") / "pipe", seed=1)


@pytest.fixture(scope="module")
def pusht():
    return suites.get("pusht")


@pytest.fixture(scope="module")
def windows(pusht):
    return pusht.windows(1, MEDIA)


def _condition(pusht, kind: str) -> Condition:
    chosen = kind_named(kind)
    action = pusht.actions_of(chosen.action_mode, FRAMES - 1) if chosen.action_mode else None
    return Condition(kind=chosen, source="pusht", action=action)


def _evaluator(folder, pusht, windows, kind: str, seeds: int = 2) -> WorldEvaluator:
    parts = load_parts(folder, heads=True)
    return WorldEvaluator(
        windows, seeds, pusht, _condition(pusht, kind), SamplerSettings(2, None, 1.0), tokenizer=parts.tokenizer, vae=parts.vae,
        media=MEDIA, latent_shape=latent_shape(MEDIA, parts.vae.config, parts.transformer.config), device=torch.device("cpu"),
        model_parts=parts,
    )  # fmt: skip


def test_the_held_out_windows_are_a_fixed_split_at_the_runs_size(pusht, windows):
    assert pusht.is_episodic and not suites.get("shapes_video").is_episodic
    assert [w.task for w in windows] == ["planner", "random"]
    for window in windows:
        assert window.frames.shape == (FRAMES, SIZE, SIZE, 3) and window.actions.shape == (FRAMES - 1, 2)
        assert window.states.shape == (FRAMES, 10)
    # A larger share keeps the earlier episodes (per-task prefixes of one split), frame for frame.
    more = pusht.windows(2, MEDIA)
    assert [w.task for w in more] == ["planner", "planner", "random", "random"]
    assert np.array_equal(more[0].frames, windows[0].frames) and np.array_equal(more[2].frames, windows[1].frames)
    assert SPLIT_SEED == 50_000
    # A prompt-suite question asked of an episode suite names what it is instead.
    with pytest.raises(ValueError, match="'pusht' is an episode suite: it has no held-out prompts"):
        pusht.held_out(1)
    with pytest.raises(ValueError, match="'shapes' is a prompt suite"):
        suites.get("shapes").windows(1, MEDIA)


@pytest.mark.parametrize("kind", ["forward_dynamics", "inverse_dynamics", "policy", "first_frame"])
def test_ground_truth_at_the_scoring_seam_scores_strict_one(folder, pusht, windows, kind):
    evaluator = _evaluator(folder, pusht, windows, kind)
    truth = np.stack([windows[item.window].frames for item in evaluator.items])
    actions = np.stack([windows[item.window].actions for item in evaluator.items])
    scores = evaluator.scores(evaluator.judge(evaluator.items, truth, actions))
    assert scores.main.score == 1.0 and scores.main.score_partial == 1.0
    assert scores.main.tasks == {"planner": 1.0, "random": 1.0}
    assert scores.main.intervals.overall == (1.0, 1.0)
    assert scores.main.images == {"planner": 2, "random": 2}  # 1 window x 2 seeds per task
    if kind == "inverse_dynamics":
        assert scores.metrics["action_error"].score == 0.0
    if kind == "policy":  # the true actions executed from the window's true state: the episode's own coverage
        assert set(scores.metrics) == {"coverage_change", "reward"}


def test_inverse_dynamics_errors_by_hand_and_the_paired_change(folder, pusht, windows):
    """Every generated row off by (6, 8) world units: an L2 error of 10 > the 7.5-unit tolerance, so
    no row passes (strict 0, partial 0, action_error 10); against the truth the change is -1 on
    every window, its paired interval [-1, -1]."""
    evaluator = _evaluator(folder, pusht, windows, "inverse_dynamics")
    truth = np.stack([windows[item.window].frames for item in evaluator.items])
    actions = np.stack([windows[item.window].actions for item in evaluator.items]).astype(np.float64)
    right = evaluator.scores(evaluator.judge(evaluator.items, truth, actions))
    wrong = evaluator.scores(evaluator.judge(evaluator.items, truth, actions + np.array([6.0, 8.0])))
    assert wrong.main.score == 0.0 and wrong.main.score_partial == 0.0
    assert wrong.metrics["action_error"].score == pytest.approx(10.0, abs=1e-4)  # float32 actions
    change = difference(wrong.main, right.main)
    assert change.score == -1.0 and change.intervals.overall == (-1.0, -1.0)
    # One row of four within tolerance (off by (3, 4): 5 units): partial 1/4, strict 0.
    one = actions.copy()
    one[:, 1:] += np.array([6.0, 8.0])
    one[:, 0] += np.array([3.0, 4.0])
    assert evaluator.scores(evaluator.judge(evaluator.items, truth, one)).main.score_partial == 0.25


def test_a_frozen_clip_fails_forward_dynamics_where_the_world_moves(folder, pusht, windows):
    evaluator = _evaluator(folder, pusht, windows, "forward_dynamics", seeds=1)
    frozen = np.stack([np.repeat(windows[item.window].frames[:1], FRAMES, axis=0) for item in evaluator.items])
    verdicts = evaluator.judge(evaluator.items, frozen, None)
    for window, verdict in zip(windows, verdicts):
        # The agent left its frame-0 place by more than the agent check's tolerance: 7.5 units, at
        # least 1 px (16 units at 32).
        moved = np.hypot(*(window.states[1:, :2] - window.states[0, :2]).T) > agent_tolerance_px(SIZE) * 512 / SIZE
        assert verdict.strict == (0.0 if moved.any() else 1.0)


def test_cli_evaluates_a_tiny_folder_with_action_heads_end_to_end(folder, pusht, windows, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", str(folder), "--suite", "pusht", "--condition", "forward_dynamics", "--image-size", str(SIZE), "--frames", str(FRAMES),
            "--per-task", "1", "--seeds", "1", "--sample-steps", "2", "--out", str(out), "--device", "cpu", "--json"]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    result = json.loads((out / "eval.json").read_text())
    assert result["suite"] == "pusht" and result["mode"] == "forward_dynamics" and result["kind"] == "model"
    assert result["sampler"]["steps"] == 2 and result["seeds"] == [0] and result["n_images"] == 2 and result["n_prompts"] == 2
    assert result["given_frames"] == 1 and result["frames"] == FRAMES and result["fps"] == 10.0
    assert result["action"] == {"mode": "forward_dynamics", "embodiment": "pusht", "chunk": FRAMES - 1, "view_point": "ego_view",
                                "offset": [256.0, 256.0], "scale": [256.0, 256.0]}  # fmt: skip
    assert [(w["task"], w["episode"], w["start"]) for w in result["windows"]] == [(w.task, w.episode.index, w.start) for w in windows]
    assert set(result["tasks"]) == {"planner", "random"} and 0.0 <= result["score"] <= result["score_partial"] + 1.0
    for key in ("score_interval", "score_partial_interval"):
        low, high = result[key]
        assert low <= result[key.replace("_interval", "")] <= high
    assert result["base_score"] is None and result["diff_score"] is None  # a model folder has no base
    gif = Image.open(result["grid_gif"])
    assert gif.n_frames == FRAMES  # one sheet per frame: the clips play side by side
    first = np.asarray(gif.convert("RGB"))
    assert first.shape[0] > 2 * 128 and first.shape[1] > 3 * 128  # 2 windows x (truth | prediction | difference), 128 px tiles
    assert (out / "windows.png").is_file()


def test_refusals_name_the_flag_and_the_fix(folder, tmp_path):
    runner = CliRunner()
    base = ["eval", str(folder), "--image-size", str(SIZE), "--frames", str(FRAMES), "--out", str(tmp_path / "x"), "--device", "cpu"]
    done = runner.invoke(app, [*base, "--suite", "pusht", "--reward", "shapes_video_strict"])
    assert done.exit_code != 0 and "scores held-out episode windows with its verifier per mode (--condition); drop --reward" in done.output
    done = runner.invoke(app, [*base, "--suite", "shapes_video", "--condition", "forward_dynamics"])
    assert done.exit_code != 0 and "pass --suite pusht" in done.output
    done = runner.invoke(app, [*base, "--suite", "shapes_video", "--data", str(tmp_path)])
    assert done.exit_code != 0 and "--data: a LeRobot dataset of held-out episodes is for an episode suite" in done.output
    done = runner.invoke(app, [*base, "--suite", "pusht", "--condition", "none"])
    assert done.exit_code != 0 and "pass forward_dynamics, inverse_dynamics, policy or first_frame" in done.output
