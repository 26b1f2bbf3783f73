"""Forward-dynamics DiffusionNFT on the world model end to end (docs/world_training.md "Training: NFT in
forward dynamics"): `cosmos-rl train` through the real CLI in this process (tests/_inproc.py) on
the session's Ray cluster, two actors (a group of 2), the reward `pusht_forward_partial` from the
built-in reward service rebuilding each Push-T window from its key, real DCP checkpoints. A run
stopped after step 1 and continued with `resume --exact` equals the straight 2-step run: the
metrics rows and the policy, old-policy and optimizer tensors.

The in-process step (tests/test_nft_world.py) proves what one step does with frame 0 and the action
rows; this file proves that the launcher, the actors, the service and the checkpoint carry it.
GRPO on window keys has no run here: its exact resume on Ray is tests/test_grpo_video.py's (a
conditioned run: image to video, the same clean-frame path), and its world-key step is that file's
in-process test.
"""

from __future__ import annotations

import pytest
from _inproc import straight_split_resumed
from _video_folders import world_nano_folder
from test_nft_ray import _checkpoint_tensors, _deterministic, _rows
from test_nft_world import MANIFEST, _overrides

pytestmark = pytest.mark.slow

STEPS = 2


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("nft_world_ray")
    folder = world_nano_folder(root / "pipe", seed=3)
    # test_nft_world's tiny settings (two window keys x a group of 2, 5 frames at 32x32); the
    # checkpoint of the last step only.
    base = [o for o in _overrides(folder, root) if not o.startswith("rl.max_steps")] + ["checkpoint.every=100"]
    return straight_split_resumed(MANIFEST, base, root, STEPS)


def test_forward_dynamics_nft_on_ray_resumed_exactly_equals_the_straight_run(runs, tmp_path):
    for leg in ("straight", "first", "resumed"):
        assert runs[leg].returncode == 0, f"{leg}: " + runs[leg].stderr[-3000:]
        assert "Traceback" not in runs[leg].stderr, runs[leg].stderr[-3000:]
    straight, split = runs["root"] / "straight", runs["root"] / "split"
    rows = _rows(straight)
    assert [r["step"] for r in rows] == [1, 2] and [r["step"] for r in runs["rows_at_stop"]] == [1]
    for row in rows:
        # the verifier's partial score of each clip against the key's true states: a fraction, and
        # the untrained folder's clips do not all pass (a constant 1.0 would be no verdict)
        assert 0.0 <= row["train/reward_mean"] < 1.0 and row["train/grad_norm"] > 0.0
    assert rows[0]["train/kl_loss"] == 0.0 < rows[1]["train/kl_loss"]  # the policy moved at step 1
    assert [_deterministic(r) for r in _rows(split)] == [_deterministic(r) for r in rows]
    a, b = _checkpoint_tensors(straight, STEPS, tmp_path), _checkpoint_tensors(split, STEPS, tmp_path)
    weights = [k for k in a if k.startswith(("policy.", "old.", "optimizer."))]
    assert any(k.startswith("old.") for k in weights) and any(k.startswith("optimizer.") for k in weights) and set(a) == set(b)
    for key in weights:
        assert a[key].equal(b[key]), key
    # LoRA's B starts at zero: the policy moved off the base
    assert any(k.startswith("policy.") and "lora_B" in k and a[k].abs().sum() > 0 for k in weights)
