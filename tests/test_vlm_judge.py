"""The VLM judge reward against a stand-in OpenAI-compatible chat server on 127.0.0.1 (stdlib
http.server): scores parsed from the answers, images as base64 PNG data URLs, a clip's sampled
frames, and every failure one line naming the sample and what came back; then the same reward
through the path the online trainer scores with (services, MultiRewardClient, the rank's score fn)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from _judge_server import MODEL, StandIn, _decoded
from cosmos_rl.config import load
from cosmos_rl.core.errors import RewardUnavailable, UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.core.schema_online import JudgeConfig
from cosmos_rl.rewards.client import RewardServiceError
from cosmos_rl.rewards.vlm_judge import VLMJudgeClient, parse_score, sampled_frames

SMOKE = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"
PATTERN = re.compile(JudgeConfig().score_regex)


@pytest.fixture
def judge_server():
    server = StandIn()
    yield server
    server.close()


def _client(url, timeout_s=10.0, **judge):
    return VLMJudgeClient(url, "judge", JudgeConfig(model=MODEL, **judge), timeout_s, 0, 0.0, key="rl.reward")


def _images(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 16, 16, 3), dtype=np.uint8)




def test_parse_score_and_sampled_frames_by_hand():
    assert parse_score("Score: 7", PATTERN, 0, 10) == 7.0
    assert parse_score("I think... score = 3.5 overall", PATTERN, 0, 10) == 3.5
    with pytest.raises(ValueError, match="does not match"):
        parse_score("seven", PATTERN, 0, 10)
    with pytest.raises(ValueError, match=r"score 11 is outside score_range \[0, 10\]"):
        parse_score("Score: 11", PATTERN, 0, 10)
    assert sampled_frames(17, 3) == [0, 8, 16] and sampled_frames(9, 1) == [0] and sampled_frames(2, 5) == [0, 1]


def test_scores_are_parsed_and_images_go_as_png_data_urls(judge_server):
    judge_server.answers = {"a red circle": "Score: 7", "two blue squares": "The image shows two squares. score: 3.5"}
    images = _images(2)
    client = _client(judge_server.url)
    try:
        assert client.check_revision(MediaSpec(1, 16, 16))["models"] == [MODEL]
        assert client.score(images, ["a red circle", "two blue squares"]) == [7.0, 3.5]
    finally:
        client.close()
    by_caption = {re.search(r'caption "([^"]*)"', r["messages"][0]["content"][-1]["text"]).group(1): r for r in judge_server.requests}
    for i, caption in enumerate(["a red circle", "two blue squares"]):
        body = by_caption[caption]
        assert body["model"] == MODEL and body["temperature"] == 0 and body["max_tokens"] == 32
        parts = body["messages"][0]["content"]
        assert [p["type"] for p in parts] == ["image_url", "text"]
        assert np.array_equal(_decoded(parts[0]), images[i])  # lossless: the judge sees the exact pixels


def test_a_clip_sends_its_sampled_frames_in_one_message(judge_server):
    judge_server.answers = {"a circle moving left": "Score: 4"}
    clip = np.random.default_rng(1).integers(0, 256, size=(1, 9, 8, 8, 3), dtype=np.uint8)
    client = _client(judge_server.url, frames=3)
    try:
        assert client.score(clip, ["a circle moving left"]) == [4.0]
    finally:
        client.close()
    parts = judge_server.requests[0]["messages"][0]["content"]
    sent = [_decoded(p) for p in parts if p["type"] == "image_url"]
    assert len(sent) == 3 and all(np.array_equal(a, clip[0, i]) for a, i in zip(sent, [0, 4, 8]))


def test_an_unparsable_answer_names_the_sample_and_the_answer_escaped(judge_server):
    judge_server.answers = {"a red circle": "Score: 6", "two blue squares": "I cannot rate this\nsorry"}
    client = _client(judge_server.url)
    try:
        with pytest.raises(RewardServiceError) as caught:
            client.score(_images(2), ["a red circle", "two blue squares"])
    finally:
        client.close()
    line = str(caught.value)
    assert "\n" not in line
    assert "rl.reward (VLM judge Qwen/Qwen2.5-VL-7B-Instruct at " in line
    assert "sample 1 (prompt 'two blue squares')" in line and "does not match the answer" in line
    assert "the judge answered 'I cannot rate this\\nsorry'" in line


def test_a_score_out_of_range_is_an_error_not_a_clamp(judge_server):
    judge_server.answers = {"a red circle": "Score: 12"}
    client = _client(judge_server.url)
    try:
        with pytest.raises(RewardServiceError, match=r"sample 0 \(prompt 'a red circle'\): score 12 is outside score_range \[0, 10\]"):
            client.score(_images(1), ["a red circle"])
    finally:
        client.close()


def test_a_timeout_is_an_error_naming_the_sample_and_the_limit(judge_server):
    judge_server.answers, judge_server.slow = {"a red circle": "Score: 5"}, {"a red circle"}
    client = _client(judge_server.url, timeout_s=0.3)
    try:
        with pytest.raises(RewardServiceError) as caught:
            client.score(_images(1), ["a red circle"])
    finally:
        client.close()
    assert "sample 0 (prompt 'a red circle'): POST /chat/completions failed 1 time(s)" in str(caught.value)
    assert "no answer within 0.3 s (rl.reward.timeout_s)" in str(caught.value)


def test_a_server_without_the_model_is_refused_before_training(judge_server):
    client = VLMJudgeClient(judge_server.url, "judge", JudgeConfig(model="other/vlm"), 10.0, 0, 0.0, key="rl.rewards[1]")
    with pytest.raises(UserError, match=r"rl.rewards\[1\].judge.model: the judge at .* serves \['Qwen/Qwen2.5-VL-7B-Instruct'\], not 'other/vlm'"):
        client.check_revision(MediaSpec(1, 16, 16))


def _judge_config(url: str):
    return load.load(SMOKE, ['rl.reward.name="judge"', 'rl.reward.revision="qwen-vl-judge-1"', f'rl.reward.url="{url}"',
                             f'rl.reward.judge.model="{MODEL}"', "rl.reward.max_retries=0"])  # fmt: skip


def test_the_trainer_scores_with_the_judge_through_its_own_client_path(judge_server):
    """What a Ray rank does: the driver's services and revision check, the rank's MultiRewardClient
    and score function (`trainers.online_scoring._scored_by`)."""
    from cosmos_rl.rewards.multi import MultiRewardClient, start_reward_services
    from cosmos_rl.trainers.online_scoring import _scored_by

    config = _judge_config(judge_server.url)
    assert _problems(config) == {}
    services = start_reward_services(config.rl)
    try:
        assert services.urls == {"judge": judge_server.url}  # no built-in service for a judge
        services.check_revisions(MediaSpec.from_model_config(config.model))
        client = MultiRewardClient.from_config(config.rl, services.urls, services.tokens)
        score = _scored_by(client)
        judge_server.answers = {"a red circle": "Score: 9", "a green triangle": "Score: 2"}
        assert score(0, _images(2), ["a red circle", "a green triangle"]) == {"judge": [9.0, 2.0]}
        judge_server.answers["a green triangle"] = "nine?"
        with pytest.raises(RewardUnavailable, match=r"rank 3: rl.reward \(VLM judge .*\): sample 1 \(prompt 'a green triangle'\)"):
            score(3, _images(2), ["a red circle", "a green triangle"])
        client.close()
    finally:
        services.stop()


def _problems(config) -> dict[str, str]:
    from cosmos_rl.config import preflight

    return {p.path: p.render() for p in preflight.check(config) if p.path.startswith("rl.reward") and p.severity == "error"}


def test_preflight_of_the_judge_table():
    def problems(*overrides):
        return _problems(load.load(SMOKE, ['rl.reward.name="judge"', 'rl.reward.revision="j1"', f'rl.reward.judge.model="{MODEL}"', *overrides]))

    assert "required for a VLM judge" in problems()["rl.reward.url"]
    url = 'rl.reward.url="http://127.0.0.1:8000/v1"'
    assert problems(url) == {}
    assert "has no capture group" in problems(url, 'rl.reward.judge.score_regex="Score: [0-9]+"')["rl.reward.judge.score_regex"]
    assert "not a regular expression" in problems(url, 'rl.reward.judge.score_regex="Score: ([0-9]+"')["rl.reward.judge.score_regex"]
    assert "lo < hi" in problems(url, "rl.reward.judge.score_range=[10, 0]")["rl.reward.judge.score_range"]
    assert ">= 1" in problems(url, "rl.reward.judge.concurrency=0")["rl.reward.judge.concurrency"]


def test_the_plan_names_the_judge_and_the_frames_it_sees():
    from cosmos_rl.planning import plan

    config = _judge_config("http://127.0.0.1:8000/v1")
    assert plan.build(config)["reward"]["endpoint"] == f"VLM judge {MODEL} at http://127.0.0.1:8000/v1"
    from cosmos_rl.core.schema_online import WeightedRewardConfig
    from cosmos_rl.planning.online_plan import _frames_scored

    term = WeightedRewardConfig(name="judge", url="http://127.0.0.1:8000/v1", judge=JudgeConfig(model=MODEL, frames=3))
    assert _frames_scored(term, 17) == "frames 0, 8, 16 of each clip, in one judge message"


def test_the_documented_rewards_table_loads_and_passes_preflight(tmp_path):
    """The `[[rl.rewards]]` + `[rl.rewards.judge]` example of docs/judge.md, in the smoke manifest."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "judge.md").read_text()
    example = re.search(r"```toml\n(\[\[rl\.rewards\]\]\nname = \"vlm_judge\".*?)```", doc, re.S).group(1)
    text = re.sub(r"\[rl\.reward\]\n(?:[^\n]+\n)*", "", SMOKE.read_text(), count=1).replace("[checkpoint]", example + "\n[checkpoint]")
    manifest = tmp_path / "judge.toml"
    manifest.write_text(text)
    config = load.load(manifest)
    (term,) = config.rl.rewards
    assert term.judge.model == MODEL and term.judge.score_range == [0, 10] and term.url == "http://127.0.0.1:8000/v1"
    assert parse_score("Score: 8", re.compile(term.judge.score_regex), *term.judge.score_range) == 8.0
    assert _problems(config) == {}
