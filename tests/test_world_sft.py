"""The world model's SFT (teacher forcing on LeRobot episodes) in the three action modes: which
part of a window is given and which is trained, the action rows' loss by hand, and an exact resume,
on a Nano-layout folder with action heads and a LeRobot dataset written in the test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _video_folders import world_nano_folder

from cosmos_rl.algorithms.sft import action_flow_loss
from cosmos_rl.config import load
from cosmos_rl.core.errors import UserError
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot_write import write_dataset
from cosmos_rl.trainers.sft import SFTTrainer

CPU = torch.device("cpu")
FRAMES, SIZE, FPS = 5, 32, 10.0  # a chunk of 4 actions; 2 latent frames with the folder's 4x temporal VAE
PUSHT = {"embodiment": "pusht", "offset": [256.0, 256.0], "scale": [256.0, 256.0]}


def test_the_action_loss_counts_only_generated_rows_and_real_columns_by_hand():
    """rows 2, action_dim 3, width 2, clean_rows 1, a0 = 0, eps = [[9, 9, 9], [1, 2, 9]], v = 0:
    only row 1's first two columns count: (1 + 4) / 2 = 2.5. A second sample with no clean row and
    width 1 adds 9 (row 0) and 1 (row 1): (1 + 4 + 81 + 1) / 4 = 21.75."""
    eps = torch.tensor([[[9.0, 9.0, 9.0], [1.0, 2.0, 9.0]]])
    zero = torch.zeros_like(eps)
    assert action_flow_loss(zero, zero, eps, [1], [2]).item() == 2.5
    two = eps.repeat(2, 1, 1)
    assert action_flow_loss(torch.zeros_like(two), torch.zeros_like(two), two, [1, 0], [2, 1]).item() == 21.75
    with pytest.raises(ValueError, match="no action row is noisy"):
        action_flow_loss(zero, zero, eps, [2], [2])


def _episode(index: int, length: int, rng: np.random.Generator) -> Episode:
    # A bright disc that follows its target (the action) over a dark floor: frames that depend on the actions.
    targets = rng.uniform(64, 448, size=(length, 2)).astype(np.float32)
    frames = np.zeros((length, SIZE, SIZE, 3), dtype=np.uint8)
    position = np.array([256.0, 256.0])
    states = np.zeros((length, 2))
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    for t in range(length):
        states[t] = position
        cx, cy = position * SIZE / 512
        frames[t][(xx - cx) ** 2 + (yy - cy) ** 2 <= 16] = (250, 200, 40)
        position = position + 0.5 * (targets[t] - position)
    return Episode(index=index, frames=frames, actions=targets, states=states, task="push the T block to the goal", fps=FPS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return world_nano_folder(tmp_path_factory.mktemp("world_sft") / "pipe", seed=3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(0)
    episodes = [_episode(i, length, rng) for i, length in enumerate((7, 9))]
    return write_dataset(tmp_path_factory.mktemp("episodes") / "pusht", episodes, fps=FPS, robot_type="pusht")


def make_config(tmp_path, folder, dataset, mode, **rl):
    raw = {
        "job": {"output_dir": str(tmp_path), "name": rl.pop("name", mode), "progress": False, "seed": 2},
        "model": {"path": str(folder), "lora": {"rank": 0}, "num_frames": FRAMES, "fps": FPS, "height": SIZE, "width": SIZE,
                  "condition": {"kind": mode, "source": "data"}, "action": PUSHT},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "sft", "max_steps": 2, "samples_per_step": 2, "optimizer": {"lr": 1e-3},
               "data": {"lerobot": str(dataset)}, **rl},
    }  # fmt: skip
    return load.structure(raw)


@pytest.mark.parametrize(
    "mode, trained",
    [("forward_dynamics", {"frames_loss"}), ("policy", {"frames_loss", "actions_loss"}), ("inverse_dynamics", {"actions_loss"})],
)
def test_each_action_mode_trains_what_it_generates(tmp_path, folder, dataset, mode, trained):
    trainer = SFTTrainer(make_config(tmp_path, folder, dataset, mode), tmp_path / mode, CPU)
    assert len(trainer.source) == (7 - 4) + (9 - 4)  # every window of 5 frames of episodes of 7 and 9 frames
    before = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    row = trainer.train_step(1)
    losses = {k.removeprefix("train/") for k in row if k.endswith("s_loss")}
    assert losses == trained
    assert math.isclose(row["train/loss"], sum(row[f"train/{k}"] for k in trained), rel_tol=1e-6)
    changed = {k.split(".")[0] for k, v in trainer.module.state_dict().items() if not torch.equal(v, before[k])}
    # Every mode reads action rows (action_proj_in); forward dynamics never predicts them, so its
    # action output projection stays frozen, and the modes that generate actions train it.
    assert "action_proj_in" in changed
    assert ("action_proj_out" in changed) == (mode != "forward_dynamics")


def test_one_model_trains_all_three_modes_each_window_drawing_its_own(tmp_path, folder, dataset):
    config = make_config(tmp_path, folder, dataset, "forward_dynamics", samples_per_step=4)
    modes = ["forward_dynamics", "policy", "inverse_dynamics"]
    config = load.structure({**load.to_dict(config), "model": {**load.to_dict(config)["model"], "condition": {
        "kind": "forward_dynamics", "source": "data", "modes": modes}}})  # fmt: skip
    trainer = SFTTrainer(config, tmp_path / "mix", CPU)
    rows = [trainer.train_step(step) for step in range(1, 4)]
    for row in rows:
        shares = [row[f"train/{m}_share"] for m in modes]
        assert math.isclose(sum(shares), 1.0) and all(s * 4 == int(s * 4) for s in shares)
        generated = {"frames_loss"} if row["train/forward_dynamics_share"] == 1 else {"frames_loss", "actions_loss"}
        if row["train/inverse_dynamics_share"] == 1:
            generated = {"actions_loss"}
        assert generated <= {k.removeprefix("train/") for k in row}
    assert any(0 < row["train/policy_share"] + row["train/inverse_dynamics_share"] for row in rows)
    # The action output projection trains: some mode generates actions.
    assert all(p.requires_grad for n, p in trainer.module.named_parameters() if n.startswith("action_proj_out"))


def test_a_world_sft_run_resumes_exactly(tmp_path, folder, dataset):
    straight = SFTTrainer(make_config(tmp_path, folder, dataset, "policy", name="straight", max_steps=3), tmp_path / "straight", CPU)
    straight.run()
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["train/loss"]) for r in rows) and len(rows) == 3
    SFTTrainer(make_config(tmp_path, folder, dataset, "policy", name="split", max_steps=1), tmp_path / "split", CPU).run()
    resumed = SFTTrainer(make_config(tmp_path, folder, dataset, "policy", name="split", max_steps=3), tmp_path / "split", CPU, resume=True)
    resumed.run()
    for (name, a), b in zip(straight.module.state_dict().items(), resumed.module.state_dict().values()):
        assert torch.equal(a, b), name


def test_frames_of_another_size_are_refused_with_both_sizes(tmp_path, folder, dataset):
    config = make_config(tmp_path, folder, dataset, "forward_dynamics")
    config = load.structure({**load.to_dict(config), "model": {**load.to_dict(config)["model"], "height": 48, "width": 48}})
    trainer = SFTTrainer(config, tmp_path / "big", CPU)
    with pytest.raises(UserError, match=r"episode 0 frames 0\.\.4: frames are 32x32, the run makes 48x48; set model.height = 32"):
        trainer.source[0]


@pytest.mark.slow
def test_the_public_world_manifest_trains_on_cpu_with_the_documented_overrides(tmp_path, folder):
    """manifests/sft_world_pusht_public_8gpu.toml under torchrun on one CPU rank, on Push-T episodes
    `python -m cosmos_rl.pusht dataset` writes, with docs/world.md's "On a CPU first" overrides."""
    from pathlib import Path

    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.pusht.__main__ import main as pusht_main

    data = tmp_path / "pusht"
    assert pusht_main(["dataset", str(data), "--episodes", "2", "--frames", "18", "--size", str(SIZE), "--seed", "3"]) == 0
    manifest = Path(__file__).resolve().parents[1] / "manifests" / "sft_world_pusht_public_8gpu.toml"
    overrides = [
        f'model.path="{folder}"', f'rl.data.lerobot="{data}"', 'grid.device="cpu"', 'model.dtype="float32"', "model.height=32",
        "model.width=32", "grid.gpus_per_node=1", "model.config.parallelism.data_parallel_shard_degree=1", "rl.samples_per_step=2",
        "rl.max_steps=1", f'job.output_dir="{tmp_path}"',
    ]  # fmt: skip
    config = load.load(manifest, overrides)
    assert launch.train(config, manifest, Console(stderr=True)) == 0
    run_dir = tmp_path / config.job.name
    assert (run_dir / "checkpoints" / "step_1" / "COMMITTED").is_file()
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert math.isfinite(row["train/frames_loss"]) and "train/actions_loss" not in row
