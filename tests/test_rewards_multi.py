"""Several rewards in one run: the advantage math (hand-worked), the services, the client, identity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from _reward_models import tiny_clip_folder
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.planning import plan
from cosmos_rl.algorithms.nft import group_advantages
from cosmos_rl.algorithms.multi_reward import combined_advantages, reward_metric_names, reward_metrics, weighted_reward
from cosmos_rl.config import load
from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.functions import brightness, prompt_colour
from cosmos_rl.rewards.models import ClipRewardModel
from cosmos_rl.rewards.multi import MultiRewardClient, reward_terms, start_reward_services
from cosmos_rl.rewards.server import RewardServer

IMAGE_RUN = MediaSpec.image(32)  # what a run makes; check_revision asks only images or clips
ROOT = Path(__file__).resolve().parent.parent
NFT = ROOT / "manifests" / "nft_t2i_smoke.toml"

R_A = torch.tensor([[0.0, 2.0], [0.0, 2.0]])
R_B = torch.tensor([[6.0, 0.0], [3.0, 3.0]])
W = {"a": 1.0, "b": 0.5}


def test_normalised_sum_by_hand():
    """adv(R_a) = [[-1, 1], [-1, 1]] (batch std 1); adv(R_b) = [[3, -3], [0, 0]] / sqrt(4.5)
    = [[1.4142, -1.4142], [0, 0]]; A = adv(R_a) + 0.5 adv(R_b) = [[-0.2929, 0.2929], [-1, 1]]."""
    got = combined_advantages({"a": R_A, "b": R_B}, W, "normalised_sum", std_scope="batch", eps=0.0)
    half_root2 = 0.5 * 2**0.5
    assert got.flatten().tolist() == pytest.approx([-1 + half_root2, 1 - half_root2, -1.0, 1.0], abs=1e-12)


def test_weighted_sum_by_hand():
    """R = R_a + 0.5 R_b = [[3, 2], [1.5, 3.5]]; group means 2.5; centred [[0.5, -0.5], [-1, 1]];
    batch std sqrt(((0.5)^2 + (0.5)^2 + 1 + 1) / 4) = sqrt(0.625) = 0.790569."""
    assert weighted_reward({"a": R_A, "b": R_B}, W).tolist() == [[3.0, 2.0], [1.5, 3.5]]
    got = combined_advantages({"a": R_A, "b": R_B}, W, "weighted_sum", std_scope="batch", eps=0.0)
    s = 0.625**0.5
    assert got.flatten().tolist() == pytest.approx([0.5 / s, -0.5 / s, -1 / s, 1 / s], abs=1e-12)
    # the point of the knob: b's larger scale flips the first prompt's order under weighted_sum only
    assert got[0, 0] > got[0, 1]


def test_group_scope_by_hand():
    """std_scope = "group", eps = 1e-4: R_b's second prompt is constant -> 0 / (0 + eps) = 0; its first
    has std 3 -> [3, -3] / 3.0001. normalised_sum = [[-1 + 0.5, 1 - 0.5], [-1, 1]] to within 1e-4."""
    got = combined_advantages({"a": R_A, "b": R_B}, W, "normalised_sum", std_scope="group", eps=1e-4)
    assert got.flatten().tolist() == pytest.approx([-0.5, 0.5, -1.0, 1.0], abs=1e-4)


def test_bad_inputs():
    with pytest.raises(ValueError, match="same rewards"):
        combined_advantages({"a": R_A}, W, "weighted_sum")
    with pytest.raises(ValueError, match="one \\[num_prompts, group_size\\] shape"):
        combined_advantages({"a": R_A, "b": R_B[:1]}, W, "weighted_sum")
    with pytest.raises(ValueError, match="finite number > 0"):
        combined_advantages({"a": R_A, "b": R_B}, {"a": 1.0, "b": 0.0}, "weighted_sum")
    with pytest.raises(ValueError, match="mode must be one of"):
        combined_advantages({"a": R_A, "b": R_B}, W, "max")


def test_per_reward_metrics_by_hand():
    """R_b = [[6, 0], [3, 3]]: mean 3, population std sqrt(4.5) = 2.1213."""
    assert reward_metric_names("pickscore") == ("train/pickscore/reward_mean", "train/pickscore/reward_std")
    got = reward_metrics({"a": R_A, "b": R_B})
    assert got == pytest.approx({"train/a/reward_mean": 1.0, "train/a/reward_std": 1.0,
                                 "train/b/reward_mean": 3.0, "train/b/reward_std": 4.5**0.5})  # fmt: skip


def _config(*terms: str, extra=()):
    return load.load(NFT, ["rl.reward={}", f"rl.rewards=[{', '.join(terms)}]", *extra])


def test_one_reward_form_is_one_term():
    terms = reward_terms(load.load(NFT).rl)
    assert [(t.key, t.name, t.weight, t.revision) for t in terms] == [("rl.reward", "brightness", 1.0, "builtin-v1")]


def test_two_builtin_rewards_scored_together():
    config = _config('{name="brightness", revision="b-1", weight=2.0}', '{name="prompt_colour", revision="p-1"}')
    services = start_reward_services(config.rl)
    try:
        info = services.check_revisions(IMAGE_RUN)
        assert {n: i["revision"] for n, i in info.items()} == {"brightness": "b-1", "prompt_colour": "p-1"}
        client = MultiRewardClient.from_config(config.rl, services.urls, services.tokens)
        assert client.weights == {"brightness": 2.0, "prompt_colour": 1.0}
        images = np.stack([np.full((8, 8, 3), 51, np.uint8), np.zeros((8, 8, 3), np.uint8)])
        prompts = ["a red cube", "a black cat"]
        got = client.score(images, prompts)
        assert got == {"brightness": brightness(images, prompts), "prompt_colour": prompt_colour(images, prompts)}
        client.close()
    finally:
        services.stop()


def test_model_reward_on_the_builtin_service_and_its_pins(tmp_path):
    folder = tiny_clip_folder(tmp_path / "clip")
    revision = ClipRewardModel("clipscore", folder).revision
    with RewardServer(revision="elsewhere-1") as other:
        config = _config(
            f'{{name="clipscore", revision="c-1", model="{folder}", reward_revision="{revision}"}}',
            f'{{name="brightness", revision="wrong", url="{other.url}"}}',
        )
        services = start_reward_services(config.rl)
        try:
            with pytest.raises(UserError, match=r"rl.rewards\[1\].revision is 'wrong'.*'elsewhere-1'"):
                services.check_revisions(IMAGE_RUN)
            assert services.urls["brightness"] == other.url
            assert services.urls["clipscore"].startswith("http://127.0.0.1:")
        finally:
            services.stop()
    stale = _config(f'{{name="clipscore", revision="c-1", model="{folder}", reward_revision="clipscore:sha256-0"}}')
    services = start_reward_services(stale.rl)
    try:
        with pytest.raises(UserError, match=r"rl.rewards\[0\].reward_revision"):
            services.check_revisions(IMAGE_RUN)
    finally:
        services.stop()


def test_a_service_that_is_down_at_start_names_the_entry():
    with RewardServer(revision="gone") as gone:
        url = gone.url
    config = _config(f'{{name="brightness", revision="gone", url="{url}", max_retries=0}}')
    services = start_reward_services(config.rl)
    with pytest.raises(UserError, match=r"rl.rewards\[0\].url: the reward service at http://127.0.0.1:\d+ cannot be reached before training .*connection failed"):
        services.check_revisions(IMAGE_RUN)


def test_a_missing_token_names_the_entry_before_any_service_starts():
    config = _config('{name="brightness", revision="b-1"}',
                     '{name="prompt_colour", revision="p-1", url="http://127.0.0.1:9", token_env="COSMOS_RL_TEST_NO_SUCH_VAR"}')
    with pytest.raises(UserError, match=r"rl.rewards\[1\].token_env names 'COSMOS_RL_TEST_NO_SUCH_VAR'"):
        start_reward_services(config.rl, environ={})
    services = start_reward_services(config.rl, environ={"COSMOS_RL_TEST_NO_SUCH_VAR": "t"})
    services.stop()
    assert services.tokens == {"brightness": None, "prompt_colour": "t"}


def test_one_reward_at_weight_one_gives_exactly_todays_advantages():
    rewards = torch.tensor([[0.1, 0.7, 0.3], [0.5, 0.5, 0.9]], dtype=torch.float64)
    for scope in ("batch", "group"):
        got = combined_advantages({"r": rewards}, {"r": 1.0}, "weighted_sum", std_scope=scope)
        assert torch.equal(got, group_advantages(rewards, std_scope=scope))  # bit for bit: old runs resume equal


def test_service_settings_are_not_identity_but_weights_are():
    base = _config('{name="brightness", revision="b-1", url="http://127.0.0.1:1"}')
    moved = _config('{name="brightness", revision="b-1", url="http://127.0.0.1:2", timeout_s=5.0}')
    heavier = _config('{name="brightness", revision="b-1", url="http://127.0.0.1:1", weight=3.0}')
    flat = load.flatten(load.to_dict(base))
    assert flat["rl.rewards[0].url"] == "http://127.0.0.1:1" and flat["rl.rewards[0].weight"] == 1.0
    assert plan.run_identity(moved) == plan.run_identity(base)
    assert plan.run_identity(heavier) != plan.run_identity(base)
