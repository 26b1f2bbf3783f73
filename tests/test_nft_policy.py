"""DiffusionNFT on the world model in policy mode (docs/world_policy.md): the pure pieces and the
service, with hand values. Each rollout generates frames and action rows from frame 0; the rewards
get the leading `[model.action] execute` rows de-normalised to world units (`executed_actions`); the
reward `pusht_chunk_coverage` executes them from the key's true state and answers the coverage
change (`pusht.chunk_reward`), which must be gym-pusht's own; protocol 2 of the reward service
carries the rows. The end-to-end run on Ray is tests/test_nft_policy_ray.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from cosmos_rl.config import load
from test_nft_world import CHUNK, FRAMES, SIZE, _errors, _overrides, folder  # noqa: F401 (the module's folder fixture)

REPO = Path(__file__).resolve().parents[1]
POLICY = REPO / "manifests" / "nft_pusht_policy_cpu.toml"
DYNAMICS = REPO / "manifests" / "nft_pusht_dynamics_cpu.toml"
# Windows whose block overlaps the goal (coverage 0.49 and 0.19 at their start): actions change it.
KEYS = [
    "pusht window seed=7 task=planner episode=6 start=1 length=8",
    "pusht window seed=7 task=planner episode=5 start=2 length=8",
]


def test_executed_actions_are_the_leading_rows_de_normalised_to_world_units():
    from cosmos_rl.pusht.episodes import action_spec
    from cosmos_rl.trainers.online_policy import executed_actions

    spec = action_spec("policy", 3)  # row * 256 + 256
    rows = torch.tensor([[[0.5, -0.25, 9.0], [-1.0, 1.0, 9.0], [0.0, 0.125, 9.0]]])  # column 2 is padding
    assert executed_actions(spec, rows, 2).tolist() == [[[384.0, 192.0], [0.0, 512.0]]]
    assert executed_actions(spec, rows, 0).tolist() == [[[384.0, 192.0], [0.0, 512.0], [256.0, 288.0]]]  # 0: the whole chunk
    with pytest.raises(ValueError, match=r"execute must be in \[0, 3\]"):
        executed_actions(spec, rows, 4)


def test_the_chunk_reward_is_the_coverage_change_gym_pusht_itself_reports():
    from gym_pusht.envs.pusht import PushTEnv

    from cosmos_rl.pusht.chunk_reward import chunk_coverage_change
    from cosmos_rl.pusht.sim import STATE_WIDTH

    env = PushTEnv(obs_type="state", render_mode="rgb_array")
    env.reset(seed=0, options={"reset_to_state": [100, 380, 236, 250, np.pi / 4 + 0.3]})  # the block on the goal, askew
    agent, block = env.agent, env.block
    start = np.array([*agent.position, *block.position, block.angle, *agent.velocity, *block.velocity, block.angular_velocity])
    assert start.size == STATE_WIDTH
    lead_in, chunk = [[150.0, 330.0]], [[200.0, 300.0], [230.0, 280.0], [250.0, 270.0], [260.0, 265.0]]
    for action in lead_in:
        env.step(np.array(action))
    before = env._get_coverage()
    for action in chunk:
        _, _, _, _, info = env.step(np.array(action))
    assert before > 0.6 and info["coverage"] < 0.2  # the agent knocks the block off the goal
    assert chunk_coverage_change(start, np.array(lead_in), np.array(chunk)) == pytest.approx(info["coverage"] - before, abs=1e-12)
    with pytest.raises(ValueError, match="generated actions"):
        chunk_coverage_change(start, np.array(lead_in), np.zeros((0, 2)))


def test_the_reward_service_carries_each_samples_action_rows_protocol_2():
    from cosmos_rl.core.errors import UserError
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.pusht.sim import coverage_of
    from cosmos_rl.rewards.client import RewardClient
    from cosmos_rl.rewards.server import RewardServer
    from cosmos_rl.suites.pusht import window_of

    media = MediaSpec(frames=FRAMES, height=SIZE, width=SIZE, fps=10.0)
    windows = [window_of(key, media) for key in KEYS]
    clips = np.stack([w.frames for w in windows])
    # each window's own first 3 actions: executed from its true state, they reach its recorded states
    actions = np.stack([w.actions[:3] for w in windows])
    expected = [coverage_of(w.states[3]) - coverage_of(w.states[0]) for w in windows]
    assert any(abs(e) > 1e-3 for e in expected)
    with RewardServer(revision="r") as server:
        info = requests.get(server.url + "/info", timeout=10).json()
        assert info["protocol"] == 2 and info["action_rewards"] == ["pusht_chunk_coverage"]
        client = RewardClient(server.url, "pusht_chunk_coverage", "r", 30.0, 0, 0.0)
        client.check_revision(media)
        scores, _ = client.score_dimensions(clips, KEYS, actions=actions)
        assert scores == pytest.approx(expected, abs=1e-9)
        with pytest.raises(UserError, match="scores each clip's generated action rows, and this run generates none"):
            client.score_dimensions(clips, KEYS)
        body = {"reward": "pusht_chunk_coverage", "prompts": KEYS[:1], "clips": [[_png(f) for f in clips[0]]]}
        for extra, status, words in [
            ({}, 400, "scores each sample's action rows: send actions"),
            ({"actions": [[[300.0, 300.0]], [[1.0, 2.0]]]}, 400, r"one list of action rows per prompt \(1\), got 2 entries"),
            ({"actions": [[[300.0, 300.0, 1.0]]]}, 400, r"takes \[N, n, 2\] action rows"),
            ({"actions": [[[300.0, "x"]]]}, 400, "must hold finite numbers"),
            ({"actions": [[[300.0, 300.0]] * (CHUNK + 1)]}, 400, r"1 <= n <= 4"),
        ]:
            answer = requests.post(server.url + "/score", json={**body, **extra}, timeout=30)
            assert answer.status_code == status and "\n" not in answer.json()["error"], answer.text
            assert re.search(words, answer.json()["error"]), answer.json()["error"]
        forward = {**body, "reward": "pusht_forward_partial", "actions": [[[300.0, 300.0]]]}
        answer = requests.post(server.url + "/score", json=forward, timeout=30)
        assert answer.status_code == 400 and "'pusht_forward_partial' takes no action rows" in answer.json()["error"]


def _png(frame: np.ndarray) -> str:
    from cosmos_rl.rewards.client import encode_png

    return encode_png(frame)


def test_preflight_lifts_policy_for_nft_only_and_names_each_new_problem(folder, tmp_path):  # noqa: F811
    base = [*_overrides(folder, tmp_path), "model.action.execute=3"]
    assert _errors(load.load(POLICY, base)) == {}
    inverse = _errors(load.load(POLICY, [*base, 'model.condition.kind="inverse_dynamics"', "model.action.execute=0"]))
    assert "nft trains the world model in forward_dynamics or policy in this release, not inverse_dynamics" in inverse["model.condition.kind"]
    assert "does not keep in this release" in _errors(load.load(POLICY, [*base, "rl.async_reward=true"]))["rl.async_reward"]
    assert "must be in [0, 4]" in _errors(load.load(POLICY, [*base, "model.action.execute=5"]))["model.action.execute"]
    forward = _errors(load.load(POLICY, [*base, 'rl.reward.name="pusht_forward_partial"']))["rl.reward.name"]
    assert "not that world's forward dynamics" in forward
    dynamics = [*_overrides(folder, tmp_path), 'rl.reward.name="pusht_chunk_coverage"', "model.action.execute=2"]
    found = _errors(load.load(DYNAMICS, dynamics))
    assert "generate no actions there" in found["rl.reward.name"] and 'kind = "policy"' in found["rl.reward.name"]
    assert "generates none to execute" in found["model.action.execute"]
    # pairs mine samples forward dynamics: the chunk reward has no generated actions to execute there
    from cosmos_rl.commands.mining.world import check_world_options
    from cosmos_rl.core.errors import UserError

    with pytest.raises(UserError, match="executes a policy's generated action rows.*use pusht_forward_strict or pusht_forward_partial"):
        check_world_options("pusht_chunk_coverage", ["pusht_chunk_coverage"], None, None, None)


def test_the_policy_manifest_validates_and_plans_with_a_folder_that_has_action_heads(folder, tmp_path):  # noqa: F811
    from _inproc import cosmos

    given = [f'model.path="{folder}"', f'rl.init_from="{folder}"']  # its own keys: manifests/pusht_windows_train.txt
    for command in ("validate", "plan"):
        done = cosmos(command, str(POLICY), *given)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "policy" in done.stdout


def test_one_policy_step_generates_and_trains_the_action_rows_beside_the_frames(folder, tmp_path, monkeypatch):  # noqa: F811
    """One NFT step in-process (both ranks of the group): the rollouts keep frame 0 and return their
    generated rows; the rewards get the leading `execute` rows in world units; every forward
    carries noisy rows (none clean); the loss's gradient reaches the generated frames and the
    action velocity's raw columns, never frame 0 or the padding columns."""
    from _nft_local import local_trainer
    from cosmos_rl.models import packing
    from cosmos_rl.trainers.online_batch import ActionRollout

    keys = tmp_path / "keys.txt"
    keys.write_text(KEYS[0] + "\n")
    config = load.load(POLICY, [*_overrides(folder, tmp_path, keys), "rl.prompts_per_step=1", "model.action.execute=3"])
    trainer = local_trainer(config, tmp_path / "run")
    trainer.build(resume=False)
    scored, seen, layouts, frame_grads, action_grads = [], [], [], [], []
    score = trainer.score
    trainer.score = lambda rank, pixels, prompts, **kw: scored.append(kw["actions"]) or score(rank, pixels, prompts, **kw)
    rollout = trainer.rollout
    trainer.rollout = lambda *a, **kw: seen.append((a[-1], rollout(*a, **kw))) or seen[-1][1]
    real_velocity = packing.velocity

    def velocity(*args, **kwargs):
        out = real_velocity(*args, **kwargs)
        layouts.append(kwargs["action_layout"].clean_rows)
        if torch.is_grad_enabled():  # the policy's training forward
            out[0].register_hook(lambda g: frame_grads.append(g.detach().clone()))
            out[1].register_hook(lambda g: action_grads.append(g.detach().clone()))
        return out

    monkeypatch.setattr(packing, "velocity", velocity)
    metrics = trainer.train_step(1)

    (condition, rollouts), = seen
    assert all(isinstance(r, ActionRollout) and torch.equal(r[0][:, :, :1], condition) for r in rollouts)
    for rows, sent in zip((r.actions for r in rollouts), scored):
        assert rows.shape == (1, CHUNK, 6) and not rows[..., 2:].any()  # the tiny folder's action_dim 6; pusht is 2 wide
        assert np.allclose(sent, rows[:, :3, :2].double().numpy() * 256.0 + 256.0)  # the first 3 rows, in world units
    assert not torch.equal(rollouts[0].actions, rollouts[1].actions)  # each rank's own action noise
    assert layouts and all(clean == (0,) * len(clean) for clean in layouts)  # no row held clean, rollout or training
    assert frame_grads and all(not g[:, :, 0].any() and g[:, :, 1:].abs().sum() > 0 for g in frame_grads)
    assert action_grads and all(g[..., :2].abs().sum() > 0 and not g[..., 2:].any() for g in action_grads)
    assert 0 < metrics["train/actions_policy_loss"] < metrics["train/policy_loss"]
