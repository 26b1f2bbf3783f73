"""Closed-loop Push-T (`pusht.closed_loop`, `evaluation.closed_loop`, `eval --closed-loop`): the
rewards by hand, the receding-horizon loop under a scripted policy against the simulator's own
replay, and the tiny folder with action heads acting through the CLI: structure, determinism
(a base that is the same model on the same noise acts identically), executed = generated
actions (a replay reaches the recorded coverages and final state), and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _video_folders import world_nano_folder
from PIL import Image
from typer.testing import CliRunner

from cosmos_rl.cli import app
from cosmos_rl.pusht.closed_loop import chunk_rewards, episode_outcome, held_out_starts, run_closed_loop
from cosmos_rl.pusht.sim import rollout

SIZE, FRAMES = 32, 5  # chunks of 4 actions; the folder's VAE makes 2 latent frames of 8x8
GOAL = (256.0, 256.0, np.pi / 4)


def test_rewards_by_hand():
    # Chunks of 2 and 2 steps over coverages 0.1 -> 0.3 -> 0.2 | -> 0.5 -> 0.97.
    assert chunk_rewards([0.1, 0.3, 0.2, 0.5, 0.97], [2, 2]) == pytest.approx([0.1, 0.77])
    done = episode_outcome([0.1, 0.3, 0.2, 0.5, 0.97])
    assert (done.success, done.final_coverage, done.max_coverage, done.steps) == (True, 0.97, 0.97, 4)
    # The initial state's coverage is nothing the policy did: neither success nor the max.
    lost = episode_outcome([0.96, 0.5, 0.6, 0.4])
    assert (lost.success, lost.final_coverage, lost.max_coverage, lost.steps) == (False, 0.4, 0.6, 3)
    assert not episode_outcome([0.0, 0.95]).success  # the env's rule: above 0.95
    with pytest.raises(ValueError, match=r"chunks stepping \[2, 1\] steps do not cover an episode of 4 steps"):
        chunk_rewards([0.1, 0.3, 0.2, 0.5, 0.97], [2, 1])


def test_the_loop_executes_n_of_each_chunk_to_the_budget_or_success():
    """Episode 0: the agent left of a T short of the goal pushes right (coverage 0.41 -> 0.64, then
    the T overshoots); 5 steps, 2 of every 3 actions: chunks of 2, 2, 1. Episode 1: the T on its goal
    (coverage 1.0): success at the first step, one action of its chunk executed."""
    starts = [np.array([150, 256, 230, 256, np.pi / 4, 0, 0, 0, 0, 0.0]), np.array([100, 100, *GOAL, 0, 0, 0, 0, 0.0])]
    calls = []

    def policy(frames, index, members):
        calls.append((index, list(members), frames.copy()))
        targets = np.array([[[260.0 + index, 256.0]] * 3, [[100.0, 120.0]] * 3])[members]
        return targets, np.repeat(frames[:, None], 4, axis=1)

    episodes = run_closed_loop(starts, policy, chunk=3, execute=2, max_steps=5, size=SIZE)
    assert [(index, members) for index, members, _ in calls] == [(0, [0, 1]), (1, [0]), (2, [0])]
    pushing, done = episodes
    assert [c.executed for c in pushing.chunks] == [2, 2, 1] and [c.step for c in pushing.chunks] == [0, 2, 4]
    assert pushing.steps == 5 and [c.executed for c in done.chunks] == [1] and done.steps == 1
    assert done.outcome.success and not pushing.outcome.success
    # What was executed is what was generated (the leading actions), and the simulator's own replay
    # from the start reaches the recorded states bit for bit (coverage, shapely's area, moves by an
    # ulp between calls on one state: pusht.closed_loop's docstring).
    assert np.array_equal(pushing.executed_actions, [[260, 256]] * 2 + [[261, 256]] * 2 + [[262, 256]])
    states, coverages = rollout(starts[0], pushing.executed_actions)
    assert np.array_equal(states, pushing.states) and np.allclose(coverages, pushing.coverages, rtol=0, atol=1e-12)
    assert coverages[2] > coverages[0] and coverages[4] < coverages[2]  # the push helps, then overshoots
    assert pushing.rewards == pytest.approx([coverages[2] - coverages[0], coverages[4] - coverages[2], coverages[5] - coverages[4]])
    # Each chunk was shown the environment's frame of the step it starts at.
    for (index, members, frames), chunk in zip(calls, pushing.chunks):
        assert np.array_equal(frames[0], pushing.frames[chunk.step])
    assert pushing.frames.shape == (6, SIZE, SIZE, 3) and pushing.predicted_timeline().shape == (6, SIZE, SIZE, 3)
    with pytest.raises(ValueError, match=r"execute must be in \[1, 3\]"):
        run_closed_loop(starts, policy, chunk=3, execute=4, max_steps=5, size=SIZE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return world_nano_folder(tmp_path_factory.mktemp("closed_loop") / "pipe", seed=1)


def test_cli_closed_loop_on_the_tiny_folder(folder, tmp_path):
    """2 held-out initial states x 1 seed, 2 of every 4 actions executed, 4 steps: 2 chunks an
    episode; the base is the same folder, so identical noise must give identical episodes."""
    out = tmp_path / "eval"
    args = ["eval", str(folder), "--suite", "pusht", "--condition", "policy", "--closed-loop", "--image-size", str(SIZE),
            "--frames", str(FRAMES), "--per-task", "2", "--seeds", "1", "--execute", "2", "--max-steps", "4", "--sample-steps", "2", "--guidance", "1",
            "--base", str(folder), "--out", str(out), "--device", "cpu", "--json"]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    result = json.loads((out / "eval.json").read_text())
    assert result["closed_loop"] and result["mode"] == "policy" and result["suite"] == "pusht" and result["base_target"] == str(folder)
    assert (result["execute"], result["max_steps"], result["chunk"], result["n_prompts"], result["n_images"]) == (2, 4, 4, 2, 2)
    assert np.array_equal(result["starts"], held_out_starts(2))
    assert result["success_rate"] == result["score"] and result["max_coverage"] == result["score_partial"]
    for key in ("score", "score_partial"):
        low, high = result[f"{key}_interval"]
        assert low <= result[key] <= high
    assert set(result["metrics"]) == {"final_coverage", "chunk_coverage_change"}
    # Determinism: the same model on the same (seed, state, chunk) noise acts the same (actions and
    # states to the bit; coverage to an ulp), so the paired change is zero.
    for mine, theirs in zip(result["episodes"], result["base_episodes"]):
        assert mine["chunks"] == theirs["chunks"] and mine["final_state"] == theirs["final_state"] and mine["success"] == theirs["success"]
        assert np.allclose(mine["coverages"], theirs["coverages"], rtol=0, atol=1e-12)
    assert result["diff_score"] == 0.0 and result["diff_score_interval"] == [0.0, 0.0] and abs(result["diff_score_partial"]) < 1e-12
    for episode in result["episodes"]:
        assert episode["seed"] == 0 and episode["steps"] == 4 and [c["executed"] for c in episode["chunks"]] == [2, 2]
        assert [c["step"] for c in episode["chunks"]] == [0, 2] and all(len(c["actions"]) == 4 for c in episode["chunks"])
        # The executed actions are the generated ones: replayed from the start, the recorded run.
        executed = np.concatenate([np.array(c["actions"])[: c["executed"]] for c in episode["chunks"]])
        states, coverages = rollout(result["starts"][episode["start"]], executed)
        assert np.allclose(coverages, episode["coverages"], rtol=0, atol=1e-12) and np.array_equal(states[-1], episode["final_state"])
        assert episode["max_coverage"] == max(episode["coverages"][1:]) and episode["final_coverage"] == episode["coverages"][-1]
    gif = Image.open(result["grid_gif"])
    assert gif.n_frames == 5  # the initial frame and 4 steps
    assert np.asarray(gif.convert("RGB")).shape[0] > 4 * 128  # 2 states x (base, model) rows of 128 px tiles


def test_closed_loop_refusals_name_the_flag_and_the_fix(folder, tmp_path):
    runner = CliRunner()
    base = ["eval", str(folder), "--image-size", str(SIZE), "--frames", str(FRAMES), "--out", str(tmp_path / "x"), "--device", "cpu"]
    cases = [
        (["--suite", "pusht", "--condition", "policy", "--execute", "2"], "--execute: an option of a closed-loop evaluation"),
        (["--suite", "pusht", "--condition", "policy", "--base", str(folder)], "--base: an option of a closed-loop evaluation"),
        (["--suite", "pusht", "--condition", "forward_dynamics", "--closed-loop"], "--condition forward_dynamics: --closed-loop acts with"),
        (["--suite", "pusht", "--condition", "policy", "--closed-loop", "--execute", "5"], "--execute 5: must be in [1, 4]"),
        (["--suite", "pusht", "--condition", "policy", "--closed-loop", "--max-steps", "0"], "--max-steps 0: an episode's step budget"),
        (["--suite", "pusht", "--condition", "policy", "--closed-loop", "--data", str(tmp_path)], "--data: a closed-loop evaluation starts"),
        (["--suite", "shapes_video", "--closed-loop"], "--closed-loop: the model acts in an episode suite's simulator"),
    ]
    for extra, message in cases:
        done = runner.invoke(app, [*base, *extra])
        assert done.exit_code != 0 and message in " ".join(done.output.split()), (extra, done.output)
