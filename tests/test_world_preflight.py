"""The world model's preflight: `[model.action]` and an action-mode `model.condition.kind` agree,
the model folder has action heads that take the embodiment, SFT trains it on a LeRobot dataset,
and `validate --data` reads that dataset for the run's embodiment, window and frame size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _model_folders import stub_model_folder

from cosmos_rl.config import algorithms, load
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot_write import write_dataset

ROOT = Path(__file__).resolve().parent.parent
WORLD = ROOT / "manifests" / "sft_world_pusht_public_8gpu.toml"
SFT = ROOT / "manifests" / "sft_shapes_cpu.toml"


def errors(manifest: Path, overrides: list[str]) -> dict[str, str]:
    _, problems = load.load_all_problems(manifest, overrides)
    return {p.path: p.render() for p in problems if p.severity == "error"}


def action_folder(root: Path, **transformer) -> Path:
    folder = stub_model_folder(root)
    config = {"action_gen": True, "action_dim": 6, "num_embodiment_domains": 21, **transformer}
    (folder / "transformer" / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def world(tmp_path) -> list[str]:
    (tmp_path / "episodes").mkdir()
    return [f'model.path="{action_folder(tmp_path / "nano")}"', f'rl.data.lerobot="{tmp_path / "episodes"}"']


def test_the_public_world_manifest_passes_with_a_folder_and_a_dataset(world):
    assert errors(WORLD, world) == {}
    config = load.load(WORLD, world)
    assert config.model.condition.kind == "forward_dynamics" and config.model.action.embodiment == "pusht"


WORLD_CASES = [
    # (overrides, key that must be named, text in the message)
    (['model.action.embodiment=""'], "model.action.embodiment", "set it to one of"),
    (['model.action.embodiment="humanoid_x"'], "model.action.embodiment", "agibot_gear_gripper"),
    (["model.action.offset=[256.0]"], "model.action.offset", "needs 2 finite numbers"),
    (["model.action.scale=[]"], "model.action.offset", "come together"),
    (["model.action.scale=[256.0, 0.0]"], "model.action.scale", "no entry may be 0"),
    (['model.action.view_point="top"'], "model.action.view_point", "ego_view"),
    (["model.condition.probability=0.5"], "model.condition.probability", "every window"),
    (['rl.data.jsonl="x.jsonl"'], "rl.data", "more than one data source"),
    (['rl.data.camera="observation.image"', 'rl.data.lerobot=""'], "rl.data.camera", "no rl.data.lerobot"),
    (["model.num_frames=1"], "model.condition.kind", "this run makes images"),
    (['model.condition.modes=["policy", "inverse_dynamics"]'], "model.condition.modes", "that include the kind, 'forward_dynamics'"),
    (['model.condition.modes=["forward_dynamics", "forward_dynamics"]'], "model.condition.modes", "must be distinct action modes"),
    (['model.condition.modes=["forward_dynamics", "dreaming"]'], "model.condition.modes", "must be distinct action modes"),
]


@pytest.mark.parametrize("overrides, key, text", WORLD_CASES)
def test_world_rule(world, overrides, key, text):
    found = errors(WORLD, [*world, *overrides])
    assert key in found and text in found[key], found


@pytest.mark.parametrize(
    "transformer, text",
    [({"action_gen": False}, "has no action heads"), ({"num_embodiment_domains": 4}, "pusht is domain 4"), ({"action_dim": 1}, "narrower")],
)
def test_the_folder_needs_action_heads_that_take_the_embodiment(tmp_path, world, transformer, text):
    folder = action_folder(tmp_path / "other", **transformer)
    found = errors(WORLD, [*world, f'model.path="{folder}"'])
    assert text in found["model.path"]


def test_a_preset_has_no_action_heads_and_other_algorithms_do_not_train_actions(world):
    found = errors(WORLD, [world[1], 'model.path=""', 'model.preset="tiny"'])
    assert "builds no action heads" in found["model.preset"]
    found = errors(SFT, ['model.action.embodiment="pusht"'])
    assert "model.action" in found and 'model.condition.kind = "forward_dynamics"' in found["model.action"]
    found = errors(SFT, ['model.condition.modes=["policy"]'])
    assert "model.condition.kind is no action mode" in found["model.condition.modes"]
    found = errors(SFT, ['rl.data.lerobot="."', "rl.data.shards=[]"])
    assert "only an action-mode condition trains on" in found["rl.data.lerobot"]


def test_world_keys_at_their_defaults_leave_every_older_run_identity_alone():
    from cosmos_rl.planning import plan

    for manifest in sorted((ROOT / "manifests").glob("*.toml")):
        fields = plan.identity_fields(load.load(manifest))
        if "world" not in manifest.name and "pusht" not in manifest.name:
            assert not any(k.startswith("model.action.") or k in ("rl.data.lerobot", "rl.data.camera") for k in fields), manifest.name


def _episodes(size: int, lengths=(9, 12)) -> list[Episode]:
    rng = np.random.default_rng(1)
    return [
        Episode(index=i, frames=rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8), actions=rng.uniform(0, 512, (n, 2)).astype(np.float32),
                states=rng.uniform(0, 512, (n, 5)), task="push the T block to the goal", fps=10.0)
        for i, n in enumerate(lengths)
    ]  # fmt: skip


def test_validate_data_reads_the_episodes_for_the_runs_embodiment_window_and_size(tmp_path):
    dataset = write_dataset(tmp_path / "pusht", _episodes(32), fps=10.0, robot_type="pusht")
    overrides = [f'model.path="{action_folder(tmp_path / "nano")}"', f'rl.data.lerobot="{dataset}"', "model.height=32", "model.width=32",
                 "model.num_frames=9"]  # fmt: skip
    config = load.load(WORLD, overrides)
    problems, notes = algorithms.check_data(config, WORLD.parent, full=True)
    assert problems == [] and notes == ["rl.data.lerobot: 2 episode(s), 21 frames at 10 fps, every episode decoded, 0 problem(s)"]
    # Windows of 13 frames: the 9-frame episode is too short; frames of 48 are not the dataset's 32.
    config = load.load(WORLD, [*overrides[:2], "model.height=48", "model.width=48", "model.num_frames=13"])
    rendered = [p.render() for p in algorithms.check_data(config, WORLD.parent, full=True)[0]]
    assert any("(episode 0)" in line and "fewer than one window of chunk + 1 = 13" in line for line in rendered), rendered
    assert any("frames are 32x32, the run makes 48x48; set model.height = 32, model.width = 32" in line for line in rendered), rendered
