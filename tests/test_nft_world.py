"""DiffusionNFT on the world model in forward dynamics (docs/world_training.md "NFT in forward dynamics"):
prompt rows are Push-T training-window keys; every rollout is given its window's frame 0 and true
action rows clean through the packed forward; the NFT loss sees only the generated latent frames;
the reward is the simulator verifier's score against the key's true states.

Tiny sizes: the Nano-layout folder with action heads (tests/_video_folders.world_nano_folder,
4x temporal VAE: 5 frames are 2 latent frames, latent frame 0 is pixel frame 0's alone), 32x32,
two windows x a group of 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from _video_folders import world_nano_folder
from cosmos_rl.config import load, preflight
from cosmos_rl.core.errors import UserError

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "nft_pusht_dynamics_cpu.toml"
FRAMES, CHUNK, SIZE = 5, 4, 32
# Two training windows, written out as a user's prompt file would hold them (seed 7: not the split).
KEYS = [
    "pusht window seed=7 task=planner episode=0 start=0 length=8",
    "pusht window seed=7 task=random episode=1 start=3 length=8",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return world_nano_folder(tmp_path_factory.mktemp("world_nft") / "pipe", seed=3)


def _overrides(folder: Path, tmp_path: Path, prompts: Path | None = None) -> list[str]:
    if prompts is None:
        prompts = tmp_path / "keys.txt"
        prompts.write_text("\n".join(KEYS) + "\n")
    return [
        f'model.path="{folder}"', f'rl.init_from="{folder}"', f"model.num_frames={FRAMES}", f"model.height={SIZE}", f"model.width={SIZE}",
        "rl.group_size=2", "rl.prompts_per_step=2", "rl.timesteps_per_sample=1", "rl.sample_steps=2", "rl.max_steps=1",
        "rl.sample_grid_every=0", "job.progress=false", "job.log_every=1", "checkpoint.keep=0", "model.lora.rank=4",
        "model.lora.alpha=8.0", f'rl.prompts.file="{prompts}"', f'job.output_dir="{tmp_path}"',
    ]  # fmt: skip


def _errors(config) -> dict[str, str]:
    """Each key's error messages, joined (a key may have several)."""
    out: dict[str, str] = {}
    for p in preflight.check(config, MANIFEST.parent):
        if p.severity == "error":
            out[p.path] = (out[p.path] + " || " if p.path in out else "") + f"{p.problem} | {p.fix}"
    return out


def _true_window(key_seed: int, task_number: int, episode: int, start: int, length: int):
    """The window's frames, actions and states made straight from the episode makers (the key's
    documented recipe: the env's start for seed (S, task number, I)), not through the suite."""
    from cosmos_rl.pusht.episodes import planner_episode, random_episode

    seed = int(np.random.SeedSequence([key_seed, task_number, episode]).generate_state(1)[0])
    made = (planner_episode, random_episode)[task_number](episode, seed, length, (SIZE, SIZE))
    end = start + CHUNK + 1
    return made.frames[start:end], made.actions[start : end - 1], made.states[start:end]


def test_one_forward_dynamics_nft_step_holds_frame_0_and_the_action_rows_out_of_the_loss(folder, tmp_path, monkeypatch):
    from _nft_local import local_trainer
    from cosmos_rl.models import packing
    from cosmos_rl.models.generate import condition_latents
    from cosmos_rl.rewards.registry import builtin_rewards
    from cosmos_rl.trainers import nft as nft_module

    config = load.load(MANIFEST, _overrides(folder, tmp_path))
    assert _errors(config) == {}
    trainer = local_trainer(config, tmp_path / "run")
    assert trainer.build(resume=False) == 0

    scored, seen, forwards, frame_grads, action_grads, shapes, batches = [], [], [], [], [], [], []
    next_batch = trainer.cursor.next_batch
    trainer.cursor.next_batch = lambda prompts: (lambda batch: batches.append(batch) or batch)(next_batch(prompts))
    score = trainer.score
    trainer.score = lambda rank, pixels, prompts: (lambda out: scored.append((pixels, list(prompts), out)) or out)(score(rank, pixels, prompts))
    rollout = trainer.rollout
    trainer.rollout = lambda *a, **kw: seen.append((a[-1], rollout(*a, **kw))) or seen[-1][1]
    real_velocity = packing.velocity

    def velocity(*args, **kwargs):
        out = real_velocity(*args, **kwargs)
        forwards.append((kwargs.get("actions"), kwargs.get("action_layout"), kwargs.get("clean_frames"), torch.is_grad_enabled()))
        if torch.is_grad_enabled() and isinstance(out, tuple):  # a training forward of the policy: which outputs a gradient reaches
            out[0].register_hook(lambda g: frame_grads.append(g.detach().clone()))
            if out[1].requires_grad:
                out[1].register_hook(lambda g: action_grads.append(g))
        return out

    monkeypatch.setattr(packing, "velocity", velocity)
    real_loss = nft_module.nft_math.nft_loss
    monkeypatch.setattr(nft_module.nft_math, "nft_loss",
                        lambda v_theta, v_old, v_ref, target, *rest, **kw: shapes.append(v_theta.shape[2]) or real_loss(v_theta, v_old, v_ref, target, *rest, **kw))  # fmt: skip
    metrics = trainer.train_step(1)

    (batch,) = batches
    drawn = [text for _, text in batch]
    assert sorted(drawn) == sorted(KEYS)
    truth = {KEYS[0]: _true_window(7, 0, 0, 0, 8), KEYS[1]: _true_window(7, 1, 1, 3, 8)}
    # the rows' condition: frame 0 of each key's true window, encoded; both ranks' rollouts keep it
    (condition, rollouts), = seen
    expected = torch.cat([condition_latents(trainer.model.vae, torch.from_numpy(truth[key][0][:1])) for key in drawn])
    assert torch.equal(condition, expected)
    for x0, _, _ in rollouts:
        assert torch.equal(x0[:, :, :1], condition)
    assert not torch.equal(rollouts[0][0][:, :, 1:], rollouts[1][0][:, :, 1:])  # the rest from each rank's own noise

    # every forward (rollout steps and training) carries the true action rows, all clean, padding zero
    rows = torch.stack([torch.from_numpy((truth[key][1].astype(np.float32) - 256.0) / 256.0) for key in drawn])
    assert forwards and all(actions is not None for actions, *_ in forwards)
    for actions, layout, clean, _ in forwards:
        assert layout.clean_rows == (CHUNK,) * actions.shape[0] and layout.widths == (2,) * actions.shape[0]
        per = actions.shape[0] // len(drawn)
        assert torch.allclose(actions[:, :, :2], rows.repeat_interleave(per, dim=0)) and not actions[:, :, 2:].any()
        assert clean == 1
    # the loss: the generated latent frame alone; no gradient reaches frame 0 or the action velocity
    assert shapes and set(shapes) == {1}
    assert frame_grads and all(not g[:, :, 0].any() and g[:, :, 1:].abs().sum() > 0 for g in frame_grads)
    assert action_grads == []
    assert metrics["train/grad_norm"] > 0

    # the rewards: the keys went to the verifier with the clips; ground truth scores 1.0 through the same reward
    assert [prompts for _, prompts, _ in scored] == [drawn, drawn]
    partial = builtin_rewards()["pusht_forward_partial"].fn
    clips = np.stack([truth[key][0] for key in drawn])
    assert partial(clips, drawn) == [1.0, 1.0]
    frozen = np.repeat(clips[:, :1], FRAMES, axis=1)  # frame 0 held: wrong wherever the world moved
    assert any(score < 1.0 for score in partial(frozen, drawn))
    for pixels, _, out in scored:
        assert out["pusht_forward_partial"] == partial(pixels, drawn)


def test_window_keys_rebuild_their_windows_and_refuse_the_held_out_split():
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.suites import registry
    from cosmos_rl.pusht.windows import HELD_OUT_SEED, MAKERS, training_keys, window_key
    from cosmos_rl.suites.pusht import SPLIT_SEED, TASKS

    assert (HELD_OUT_SEED, MAKERS) == (SPLIT_SEED, TASKS)  # the keys' refusal is the suite's split
    suite = registry.get("pusht")
    media = MediaSpec(frames=FRAMES, height=SIZE, width=SIZE, fps=10.0)
    window = suite.window(KEYS[1], media)
    frames, actions, states = _true_window(7, 1, 1, 3, 8)
    assert np.array_equal(window.frames, frames) and np.array_equal(window.actions, actions) and np.array_equal(window.states, states)
    assert window.caption == "Push the T-shaped block onto the T-shaped target."
    assert training_keys(1, 7, CHUNK, length=8, stride=3) == [window_key(7, t, 0, s, 8) for t in ("planner", "random") for s in (0, 3)]
    for key, words in [
        (window_key(SPLIT_SEED, "planner", 0, 0, 8), "held-out split"),
        (window_key(7, "planner", 0, 4, 8), "runs past"),
        ("pusht window seed=7 task=walker episode=0 start=0 length=8", "'walker' is not one of planner, random"),
        ("a red circle", "not a Push-T window key"),
    ]:
        with pytest.raises(ValueError, match=words):
            suite.window(key, media, check_only=True)
    with pytest.raises(ValueError, match="held-out split"):
        training_keys(1, SPLIT_SEED, CHUNK)


def test_a_row_that_is_no_key_stops_the_run_naming_file_and_line(tmp_path):
    from cosmos_rl.core.condition import Condition, FORWARD_DYNAMICS
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.pusht.episodes import action_spec
    from cosmos_rl.trainers.first_frames import FirstFrames

    prompts = tmp_path / "keys.txt"
    prompts.write_text(f"{KEYS[0]}\npusht window seed=50000 task=planner episode=0 start=0 length=8\n")
    condition = Condition(kind=FORWARD_DYNAMICS, source="pusht", action=action_spec("forward_dynamics", CHUNK))
    with pytest.raises(UserError, match=f"{prompts}:2: .*held-out split.*python -m cosmos_rl.pusht windows"):
        FirstFrames(condition, str(prompts), MediaSpec(frames=FRAMES, height=SIZE, width=SIZE, fps=10.0))


def test_preflight_allows_nft_in_forward_dynamics_with_its_rules(folder, tmp_path):
    base = _overrides(folder, tmp_path)
    assert _errors(load.load(MANIFEST, base)) == {}
    # policy mode trains too (tests/test_nft_policy.py), with a reward that executes its actions
    policy = _errors(load.load(MANIFEST, [*base, 'model.condition.kind="policy"']))
    assert list(policy) == ["rl.reward.name"] and "not that world's forward dynamics" in policy["rl.reward.name"]
    no_key = _errors(load.load(MANIFEST, [*base, 'model.condition.source="shapes_video"']))
    assert "keys none" in no_key["model.condition.source"] and "pusht" in no_key["model.condition.source"]
    image = _errors(load.load(MANIFEST, [*base, 'model.condition.source="image"']))["model.condition.source"]
    assert "training-window keys" in image
    assert "trains LoRA" in _errors(load.load(MANIFEST, [*base, "model.lora.rank=0", "rl.old.build_old=false"]))["model.lora.rank"]
    assert "cosmos-rl eval RUN --suite" in _errors(load.load(MANIFEST, [*base, "rl.eval.every=5"]))["rl.eval.every"]
    # a pusht window key source with an image-to-video kind, and a pusht reward on a run of captions
    i2v = _errors(load.load(MANIFEST, [*base, 'model.condition.kind="first_frame"', 'model.action.embodiment=""',
                                      "model.action.offset=[]", "model.action.scale=[]"]))  # fmt: skip
    assert "window keys for an action mode" in i2v["model.condition.source"]


def test_grpo_trains_forward_dynamics_only_with_its_own_messages(folder, tmp_path):
    """GRPO takes NFT's world-model rules (forward dynamics on an episode suite's window keys),
    its messages naming GRPO."""
    text = (REPO / "manifests" / "grpo_shapes_cpu.toml").read_text()
    world = (f'[model]\npath = "{folder}"\ndtype = "float32"\nheight = {SIZE}\nwidth = {SIZE}\nnum_frames = {FRAMES}\nfps = 10.0\n\n'
             '[model.condition]\nkind = "forward_dynamics"\nsource = "pusht"\n\n[model.action]\nembodiment = "pusht"\n')  # fmt: skip
    manifest = tmp_path / "grpo_world.toml"
    manifest.write_text(text.replace('[model]\npreset = "shapes"\nimage_size = 32\n', world))
    (tmp_path / "keys.txt").write_text("\n".join(KEYS) + "\n")
    base = [f'rl.init_from="{folder}"', f'rl.prompts.file="{tmp_path / "keys.txt"}"', 'rl.reward.name="pusht_forward_strict"', "rl.eval.every=0"]
    assert _errors(load.load(manifest, base)) == {}
    policy = _errors(load.load(manifest, [*base, 'model.condition.kind="policy"']))["model.condition.kind"]
    assert "grpo trains the world model in forward_dynamics in this release, not policy" in policy
    no_key = _errors(load.load(manifest, [*base, 'model.condition.source="shapes_video"']))["model.condition.source"]
    assert "rl.algorithm = \"grpo\" in forward_dynamics takes rows that are an episode suite's training-window keys" in no_key
