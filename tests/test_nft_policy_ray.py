"""Policy-mode DiffusionNFT on the world model end to end (docs/world_policy.md): `cosmos-rl train`
through the real CLI in this process (tests/_inproc.py) on the session's Ray cluster, two actors (a
group of 2), each rollout given a Push-T window's frame 0 and generating 4 frames and 4 action rows,
the reward `pusht_chunk_coverage` from the built-in reward service (protocol 2: the first
`model.action.execute` rows travel with each clip, executed from the key's true state), real DCP
checkpoints. A run stopped after step 1 and continued with `resume --exact` equals the straight
2-step run: the metrics rows and the policy, old-policy and optimizer tensors; the straight run's
rows also show the action loss trained beside the frames'. The pure pieces and the service's
protocol are tests/test_nft_policy.py's.
"""

from __future__ import annotations

import pytest
from _inproc import straight_split_resumed
from _video_folders import world_nano_folder
from test_nft_policy import KEYS, POLICY
from test_nft_ray import _checkpoint_tensors, _deterministic, _rows
from test_nft_world import _overrides

pytestmark = pytest.mark.slow

STEPS = 2


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("nft_policy_ray")
    folder = world_nano_folder(root / "pipe", seed=3)
    keys = root / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    # test_nft_world's tiny settings (5 frames at 32x32, a group of 2), one window key a step, the
    # first 3 of each chunk's 4 actions executed; the checkpoint of the last step only.
    base = [o for o in _overrides(folder, root, keys) if not o.startswith(("rl.max_steps", "rl.prompts_per_step"))]
    base += ["rl.prompts_per_step=1", "model.action.execute=3", "checkpoint.every=100"]
    return straight_split_resumed(POLICY, base, root, STEPS)


def test_policy_nft_on_ray_trains_the_actions_and_resumes_exactly(runs, tmp_path):
    for leg in ("straight", "first", "resumed"):
        assert runs[leg].returncode == 0, f"{leg}: " + runs[leg].stderr[-3000:]
        assert "Traceback" not in runs[leg].stderr, runs[leg].stderr[-3000:]
    straight, split = runs["root"] / "straight", runs["root"] / "split"
    rows = _rows(straight)
    assert [r["step"] for r in rows] == [1, 2] and [r["step"] for r in runs["rows_at_stop"]] == [1]
    for row in rows:
        # the action rows are in the loss beside the frames (a part of the total, never all of it)
        assert 0.0 < row["train/actions_policy_loss"] < row["train/policy_loss"] and row["train/grad_norm"] > 0.0
        assert -1.0 <= row["train/reward_mean"] <= 1.0
    # the executed actions moved the block in some rollout: the service stepped them in the simulator
    assert any(row["train/reward_std"] > 0.0 for row in rows)
    assert rows[0]["train/kl_loss"] == 0.0 < rows[1]["train/actions_kl_loss"] < rows[1]["train/kl_loss"]  # the policy moved at step 1
    assert [_deterministic(r) for r in _rows(split)] == [_deterministic(r) for r in rows]
    a, b = _checkpoint_tensors(straight, STEPS, tmp_path), _checkpoint_tensors(split, STEPS, tmp_path)
    weights = [k for k in a if k.startswith(("policy.", "old.", "optimizer."))]
    assert any(k.startswith("old.") for k in weights) and any(k.startswith("optimizer.") for k in weights) and set(a) == set(b)
    for key in weights:
        assert a[key].equal(b[key]), key
    assert any(k.startswith("policy.") and "lora_B" in k and a[k].abs().sum() > 0 for k in weights)
