"""Online world-model runs on a LeRobot-format dataset (docs/world_training.md "NFT on a LeRobot dataset"):
prompt rows that are window keys of a dataset folder (`data/lerobot_windows.py`), the prediction
rewards against the recorded future (`suites/lerobot.py`: PSNR and SSIM per generated frame), and the
public NFT manifests (Push-T, and the bridge_orig_lerobot arm) that validate and plan, and the arm's
that trains on CPU with docs/world_training.md's overrides."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot_write import write_dataset
from cosmos_rl.suites.lerobot import prediction_score, psnr_frames, ssim_frames

REPO = Path(__file__).resolve().parents[1]
PUSHT_NFT = REPO / "manifests" / "nft_world_pusht_public_8gpu.toml"
BRIDGE_NFT = REPO / "manifests" / "nft_world_bridge_public_8gpu.toml"
BRIDGE_FPS, BRIDGE_WIDTH = 5.0, 10  # Bridge's control rate; Cosmos3's bridge_orig_lerobot rows (core/actions.py)


def _arm_dataset(root: Path, lengths=(18, 18), size: int = 32) -> Path:
    """A synthetic arm dataset: a bright square that moves with the first two of 10 action columns."""
    rng = np.random.default_rng(4)
    episodes = []
    for index, length in enumerate(lengths):
        actions = rng.normal(size=(length, BRIDGE_WIDTH)).astype(np.float32)
        frames = np.full((length, size, size, 3), 30, dtype=np.uint8)
        for t in range(length):
            y, x = (int(v) % (size - 6) for v in 8 * np.cumsum(actions[: t + 1, :2], axis=0)[-1] + size / 2)
            frames[t, y : y + 6, x : x + 6] = (240, 220, 60)
        episodes.append(Episode(index=index, frames=frames, actions=actions, states=np.zeros((length, 0)),
                                task="put the spoon in the pot", fps=BRIDGE_FPS))  # fmt: skip
    return write_dataset(root, episodes, fps=BRIDGE_FPS, robot_type="widowx")


# ------------------------------------------------------------------------------ the metrics
def test_psnr_by_hand_and_its_reward_skips_frame_0():
    truth = np.zeros((3, 16, 16, 3), dtype=np.uint8)
    clip = truth.copy()
    clip[0] = 255  # the given frame: never judged
    clip[2] = 16  # MSE 256: PSNR = 10 log10(255^2 / 256) = 24.0484 dB
    one_off = truth[:1] + 1  # MSE 1: 20 log10(255) = 48.1308 dB
    assert psnr_frames(one_off, truth[:1])[0] == pytest.approx(48.130803608679, abs=1e-9)
    assert psnr_frames(clip[2:], truth[2:])[0] == pytest.approx(24.048403955, abs=1e-8)
    # frame 1 equal (MSE 0, capped at 50 dB: 1), frame 2 24.0484 / 50
    assert prediction_score("psnr", clip, truth) == pytest.approx((1.0 + 24.048403955 / 50) / 2, abs=1e-8)


def _reference_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """Wang et al.'s mean SSIM written out in numpy, window by window: the 11 x 11 weights
    exp(-(dy^2 + dx^2) / (2 * 1.5^2)) normalised to sum 1, at every position where the window fits
    inside the image, per channel (the code under test convolves in torch)."""
    from numpy.lib.stride_tricks import sliding_window_view

    d = np.arange(11) - 5.0
    w = np.exp(-(d[:, None] ** 2 + d[None, :] ** 2) / (2 * 1.5**2))
    w /= w.sum()
    c1, c2, out = (0.01 * 255) ** 2, (0.03 * 255) ** 2, []
    for ch in range(3):
        a = sliding_window_view(x[..., ch].astype(np.float64), (11, 11))  # [H - 10, W - 10, 11, 11]
        b = sliding_window_view(y[..., ch].astype(np.float64), (11, 11))
        mean = lambda z: (z * w).sum(axis=(-2, -1))
        ma, mb = mean(a), mean(b)
        va, vb, cab = mean(a * a) - ma**2, mean(b * b) - mb**2, mean(a * b) - ma * mb
        out.append(np.mean((2 * ma * mb + c1) * (2 * cab + c2) / ((ma**2 + mb**2 + c1) * (va + vb + c2))))
    return float(np.mean(out))


def test_ssim_of_identical_constant_and_shifted_frames():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (1, 24, 20, 3), dtype=np.uint8)
    assert ssim_frames(frame, frame)[0] == pytest.approx(1.0, abs=1e-12)
    # two flat frames, 100 and 110: no variance, so SSIM = (2ab + C1) / (a^2 + b^2 + C1), C1 = 2.55^2
    flat = np.full((1, 16, 16, 3), 100, dtype=np.uint8)
    assert ssim_frames(flat, flat + 10)[0] == pytest.approx((22000 + 6.5025) / (22100 + 6.5025), abs=1e-12)
    shifted = np.roll(frame, 3, axis=2)
    assert ssim_frames(shifted, frame)[0] == pytest.approx(_reference_ssim(shifted[0], frame[0]), abs=1e-9)
    # the reward: frame 0 not judged, each later frame (SSIM + 1) / 2, their mean
    clip, truth = np.concatenate([255 - frame, frame, shifted]), np.concatenate([frame, frame, frame])  # frame 0 inverted: not judged
    assert prediction_score("ssim", clip, truth) == pytest.approx((1.0 + (_reference_ssim(shifted[0], frame[0]) + 1) / 2) / 2, abs=1e-9)
    with pytest.raises(ValueError, match="11x11 window"):
        ssim_frames(frame[:, :8, :8], frame[:, :8, :8])


# -------------------------------------------------------------------- keys and the reward service
def test_keys_rebuild_their_windows_and_the_rewards_judge_against_the_recorded_future(tmp_path):
    from cosmos_rl.core.actions import ActionSpec
    from cosmos_rl.core.condition import FORWARD_DYNAMICS, Condition
    from cosmos_rl.data.lerobot import open_dataset
    from cosmos_rl.data.lerobot_windows import main as write_keys
    from cosmos_rl.rewards.registry import builtin_rewards
    from cosmos_rl.trainers.first_frames import FirstFrames

    root = _arm_dataset(tmp_path / "arm", lengths=(7, 9))
    keys_file = tmp_path / "keys.txt"
    assert write_keys([str(keys_file), "--dataset", str(root), "--frames", "5", "--stride", "2"]) == 0
    keys = keys_file.read_text().splitlines()
    # episode 0 (7 frames): starts 0, 2; episode 1 (9 frames): 0, 2, 4
    assert keys == [f"lerobot window episode={e} start={s} root={root.resolve()}" for e, s in ((0, 0), (0, 2), (1, 0), (1, 2), (1, 4))]
    media = MediaSpec(frames=5, height=32, width=32, fps=BRIDGE_FPS)
    spec = ActionSpec(mode="forward_dynamics", embodiment="bridge_orig_lerobot", chunk=4)
    rows = FirstFrames(Condition(kind=FORWARD_DYNAMICS, source="lerobot", action=spec), str(keys_file), media)
    recorded = open_dataset(root).episode(1)
    window = rows.window(3)  # episode 1 from frame 2
    assert np.array_equal(window.frames, recorded.frames[2:7]) and np.array_equal(window.actions, recorded.actions[2:6])
    assert rows.caption(3) == "put the spoon in the pot" and np.array_equal(rows.given(3), recorded.frames[2:3])

    # the rewards, as the service registers them: the recorded window scores 1; frame 0 held still scores less
    rewards = builtin_rewards()
    truth = np.stack([rows.window(i).frames for i in (0, 3)])
    drawn = [keys[0], keys[3]]
    for name in ("prediction_psnr", "prediction_ssim"):
        assert rewards[name].fn(truth, drawn) == [1.0, 1.0]
        frozen = np.repeat(truth[:, :1], 5, axis=1)
        expected = [prediction_score(name.split("_")[1], clip, true) for clip, true in zip(frozen, truth)]
        assert rewards[name].fn(frozen, drawn) == expected and max(expected) < 1.0

    # bad rows stop the run before step 1, naming file:line; another robot's width on first draw
    bad = tmp_path / "bad.txt"
    for row, words in [
        (f"lerobot window episode=5 start=0 root={root}", "no episode 5 .its episodes are 0..1."),
        (f"lerobot window episode=0 start=3 root={root}", "at frame 3 runs past the episode's 7 frames"),
        ("lerobot window episode=0 start=0 root=arm", "not an absolute path"),
        (f"lerobot window episode=0 start=0 root={tmp_path}", "meta/info.json"),
        ("a red circle", "not a LeRobot window key"),
    ]:
        bad.write_text(f"{keys[0]}\n{row}\n")
        with pytest.raises(UserError, match=f"{bad}:2: .*{words}.*python -m cosmos_rl.data.lerobot_windows"):
            FirstFrames(Condition(kind=FORWARD_DYNAMICS, source="lerobot", action=spec), str(bad), media)
    for other, words in [(MediaSpec(frames=5, height=16, width=16, fps=BRIDGE_FPS), "frames are 32x32, the run makes 16x16"),
                         (MediaSpec(frames=5, height=32, width=32, fps=10.0), "recorded at 5 fps, the run's clips are 10 fps")]:  # fmt: skip
        with pytest.raises(UserError, match=f"{keys_file}:1: .*{words}"):
            FirstFrames(Condition(kind=FORWARD_DYNAMICS, source="lerobot", action=spec), str(keys_file), other)
    from cosmos_rl.suites import registry

    with pytest.raises(UserError, match="no held-out split to evaluate yet; score a Push-T world model with cosmos-rl eval RUN --suite pusht"):
        registry.get("lerobot").windows(0, media)  # `cosmos-rl eval` of a lerobot run: one line, no traceback
    pusht = ActionSpec(mode="forward_dynamics", embodiment="pusht", chunk=4)
    narrow = FirstFrames(Condition(kind=FORWARD_DYNAMICS, source="lerobot", action=pusht), str(keys_file), media)
    with pytest.raises(UserError, match=f"{keys_file}:1: the window's actions are 10 wide, pusht's are 2"):
        narrow.window(0)


# ------------------------------------------------------------------------- the public manifests
def test_the_public_world_nft_manifests_validate_and_plan_memory_per_rank(tmp_path):
    """Both manifests on a folder with Nano's layout at tiny widths (configs only: hidden 64, MLP 128,
    2 layers, patch 2, a VAE 4x in space and time, action heads 10 wide over 21 domains). 17 frames are
    5 latent frames; Push-T's 96x96 is 12 x 12 tokens a latent frame (720 a clip), Bridge's 256x256
    32 x 32 (5,120). With gradient checkpointing in bfloat16 a clip keeps 2 x tokens x 64 x 2 B of
    layer inputs + one layer's tokens x (12 x 64 + 4 x 128) x 2 B: 2,027,520 B and 14,417,920 B; NFT
    keeps 2 rows x 4 training timesteps of clips per rank."""
    from _model_folders import stub_model_folder
    from _video_folders import nano_transformer, temporal_vae

    from cosmos_rl.config import load, preflight
    from cosmos_rl.data.prompt_file import read_prompt_rows
    from cosmos_rl.planning import plan
    from cosmos_rl.rewards.prompt_rows import window_key_problems

    folder = stub_model_folder(tmp_path / "nano", flow_shift=3.0)
    nano_transformer(320, action_dim=BRIDGE_WIDTH, embodiment_domains=21).save_config(folder / "transformer")
    temporal_vae().save_config(folder / "vae")
    keys = tmp_path / "keys.txt"
    keys.write_text(f"lerobot window episode=0 start=0 root={tmp_path / 'data'}\n")
    for manifest, size, clip_bytes, reward in ((PUSHT_NFT, 96, 2_027_520, "prediction_psnr"), (BRIDGE_NFT, 256, 14_417_920, "prediction_ssim")):
        overrides = [f'model.path="{folder}"', f'rl.init_from="{folder}"', f'rl.prompts.file="{keys}"']
        config = load.load(manifest, overrides)
        assert [p.render() for p in preflight.check(config, manifest.parent) if p.severity == "error"] == []
        built = plan.build(config, str(manifest))
        assert built["world_size"] == 8 and built["media"]["frames"] == 17 and built["media"]["size"] == [size, size], manifest.name
        assert built["per_step"]["train_activation_mib_per_rank"] == round(8 * clip_bytes / 2**20, 2), manifest.name
        assert built["memory"]["shards"] == 8 and built["memory"]["terms_gib"], manifest.name
        assert reward in json.dumps(built["reward"]), manifest.name
        # validate reads the rows as the run's build does: a key to a folder that is no dataset, named file:line
        (problem,) = window_key_problems(config, keys, read_prompt_rows(keys)[0])
        assert problem.startswith(f'{keys}:1: model.condition.source = "lerobot": ') and "meta/info.json" in problem, problem
    # the arm's action rows need a folder whose heads are 10 wide: the 2-wide Push-T width is refused
    nano_transformer(320, action_dim=6, embodiment_domains=21).save_config(folder / "transformer")
    found = [p.render() for p in preflight.check(load.load(BRIDGE_NFT, overrides), BRIDGE_NFT.parent) if p.severity == "error"]
    assert len(found) == 1 and "action_dim 6 is narrower than bridge_orig_lerobot's 10 columns" in found[0]


# docs/world_training.md "On a CPU first" (NFT on a LeRobot dataset): the overrides besides the model, base and keys.
CPU_OVERRIDES = [
    'grid.device="cpu"', 'model.dtype="float32"', "model.height=32", "model.width=32", "rl.max_steps=1", "rl.sample_steps=4",
    "rl.group_size=2", "grid.shapes={policy=[1,2], rollout=[1,2]}",
]  # fmt: skip


@pytest.mark.slow
def test_the_public_bridge_nft_manifest_trains_on_cpu_with_the_documented_overrides(ray_cluster, tmp_path):
    """The arm's manifest one step on the session's Ray cluster (2 actors), from a Nano-layout folder
    with 10-wide action heads, on a synthetic 10-wide dataset at 5 fps; the window keys written by
    `python -m cosmos_rl.data.lerobot_windows`. The Push-T manifest's run would be the same code
    with other values (the pusht embodiment's 2 normalised columns, 10 fps, prediction_psnr): its
    validation and plan are the test above, its reward the service's own function in the keys test,
    and the pusht embodiment trains on Ray in tests/test_nft_world_ray.py. The arm is the one
    trained here: its 10-wide raw rows, domain 7 and SSIM reward train nowhere else."""
    from _video_folders import world_nano_folder
    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.config import load
    from cosmos_rl.data.lerobot_windows import main as write_keys

    folder = world_nano_folder(tmp_path / "nano", seed=3, action_dim=BRIDGE_WIDTH)
    keys = tmp_path / "bridge.txt"
    assert write_keys([str(keys), "--dataset", str(_arm_dataset(tmp_path / "arm")), "--frames", "17"]) == 0
    overrides = [f'model.path="{folder}"', f'rl.init_from="{folder}"', f'rl.prompts.file="{keys}"', *CPU_OVERRIDES,
                 f'job.output_dir="{tmp_path}"']  # fmt: skip
    config = load.load(BRIDGE_NFT, overrides)
    assert config.model.action.embodiment == "bridge_orig_lerobot" and config.rl.reward.name == "prediction_ssim"
    assert launch.train(config, BRIDGE_NFT, Console(stderr=True)) == 0
    run_dir = tmp_path / config.job.name
    assert (run_dir / "checkpoints" / "step_1" / "COMMITTED").is_file()
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # a prediction reward in (0, 1) from the built-in service: untrained frames are neither the recording nor nothing like it
    assert 0.0 < row["train/reward_mean"] < 1.0 and row["train/grad_norm"] > 0 and math.isfinite(row["train/loss"])
