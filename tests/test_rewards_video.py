"""Clips on the reward service, over loopback: the wire format and its limits (checked before any
decoding), /info modalities, clip rewards, and image rewards scoring clips frame by frame.

The shapes video verifier is another module's; here a stand-in with its signature
(tests/_video_scorer_standin.py: a clip "moves" when its frames grow brighter) is served under the
built-in clip reward names.
"""

from __future__ import annotations

import base64
import io
import logging
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import requests
from PIL import Image

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.planning import plan
from cosmos_rl.config import load
from cosmos_rl.config.saved_runs import with_later_knobs
from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards import client as client_module
from cosmos_rl.rewards.app import RewardApp
from cosmos_rl.rewards.client import RewardClient, RewardServiceError, encode_png
from cosmos_rl.core.schema import RewardClientConfig
from cosmos_rl.rewards.frames import DEFAULT_SETTINGS, FRAME_REDUCERS, check_frame_settings, frame_prompts, reduce_scores, scored_frames
from cosmos_rl.rewards.limits import Limits, chunks_within
from cosmos_rl.rewards.multi import MultiRewardClient, RewardTerm, client_for
from cosmos_rl.rewards.registry import ImportedScorer, Reward, builtin_rewards
from cosmos_rl.rewards.server import RewardServer
from cosmos_rl.suites import registry as suites
from cosmos_rl.shapes.caption import parse_caption
from cosmos_rl.shapes.scene import render
from cosmos_rl.shapes.spec import BACKGROUND, RGB

ROOT = Path(__file__).resolve().parent.parent
NFT = ROOT / "manifests" / "nft_t2i_smoke.toml"
REVISION = "video-1"
IMAGE_RUN, CLIP_RUN = MediaSpec.image(4), MediaSpec(3, 4, 4)  # what a run makes; check_revision asks only images or clips
STANDIN = "_video_scorer_standin:score_clips"
VIDEO_SUITE = suites.get("shapes_video")


def video_rewards(scorer: str) -> dict[str, ImportedScorer]:
    """The shapes_video suite's clip rewards, each scored by `scorer` in its mode."""
    return {r.name: ImportedScorer(scorer, r.part) for r in VIDEO_SUITE.rewards}


def _registry() -> dict[str, Reward]:
    registry = builtin_rewards()
    for name, fn in video_rewards(STANDIN).items():
        registry[name] = Reward(name, fn, f"{name}:standin", max_batch=32, modalities=("video",))
    return registry


@pytest.fixture(scope="module")
def server():
    with RewardServer(revision=REVISION, registry=_registry()) as srv:
        yield srv


def _client(url: str, reward: str, **kw) -> RewardClient:
    return RewardClient(url, reward, REVISION, 10.0, 0, 0.0, **kw)


def _clip(*values: int, side: int = 4) -> np.ndarray:
    """Frames of one flat grey value each: brightness scores them value / 255."""
    return np.stack([np.full((side, side, 3), v, np.uint8) for v in values])


def _post(url: str, body: dict) -> tuple[int, str]:
    answer = requests.post(url + "/score", json=body, timeout=30)
    return answer.status_code, answer.json().get("error", "")


# ------------------------------------------------------------------------------- the pure parts
def test_which_frames_are_scored_and_how_they_reduce():
    """9 frames, stride 4 -> 0, 4, 8; stride 3 -> 0, 3, 6; first/last one frame each.
    Frame scores 0.2, 0.4, 1.0: mean 1.6 / 3 = 0.5333, min 0.2."""
    assert scored_frames(9, "mean", 4) == [0, 4, 8]
    assert scored_frames(9, "min", 3) == [0, 3, 6]
    assert scored_frames(9, "mean", 1) == list(range(9))
    assert scored_frames(9, "first", 1) == [0] and scored_frames(9, "last", 1) == [8]
    assert scored_frames(1, "mean", 4) == [0]
    assert reduce_scores([0.2, 0.4, 1.0], "mean") == pytest.approx(1.6 / 3)
    assert reduce_scores([0.2, 0.4, 1.0], "min") == 0.2
    assert reduce_scores([0.7], "last") == 0.7
    assert FRAME_REDUCERS == ("mean", "min", "first", "last")
    assert DEFAULT_SETTINGS == (RewardClientConfig().frame_reduce, RewardClientConfig().frame_stride)
    for reduce, stride, text in [("max", 1, "must be one of"), ("mean", 0, ">= 1"), ("mean", True, ">= 1"), ("first", 2, "scores one frame")]:
        with pytest.raises(ValueError, match=text):
            check_frame_settings(reduce, stride)


def test_per_frame_prompts_are_one_per_clip_or_a_function_of_its_prompt():
    prompts = ["a red circle moving left", "a square turning from red to blue"]
    assert frame_prompts(prompts, None) == prompts
    static = {"a red circle moving left": "a red circle"}
    assert frame_prompts(prompts, static.get) == ["a red circle", None]
    assert frame_prompts(prompts, ["x", None]) == ["x", None]
    with pytest.raises(ValueError, match="got 1 per-frame prompts for 2 clips"):
        frame_prompts(prompts, ["x"])
    with pytest.raises(ValueError, match="got a string"):
        frame_prompts(prompts, "x")
    with pytest.raises(ValueError, match="string or None"):
        frame_prompts(prompts, lambda p: 3)


def test_requests_are_split_within_the_limits():
    """(frames, pixels, bytes) per item; the byte cap is 7/8 of max_body_bytes (800 -> 700)."""
    assert chunks_within([(1, 10, 5)] * 5, Limits(max_images=2)) == [(0, 2), (2, 4), (4, 5)]
    assert chunks_within([(4, 16, 5)] * 3, Limits(max_request_frames=10)) == [(0, 2), (2, 3)]
    assert chunks_within([(1, 60, 1)] * 2, Limits(max_request_pixels=100)) == [(0, 1), (1, 2)]
    assert chunks_within([(1, 500, 1), (1, 1, 1), (1, 1, 1)], Limits(max_request_pixels=100)) == [(0, 1), (1, 3)]
    assert chunks_within([(1, 1, 400)] * 2, Limits(max_body_bytes=800)) == [(0, 1), (1, 2)]
    assert chunks_within([], Limits()) == []


# --------------------------------------------------------------------------- /info and registry
def test_info_lists_what_each_reward_scores_and_whether_it_reads_its_prompt(server):
    info = requests.get(server.url + "/info", timeout=10).json()
    assert info["modalities"]["brightness"] == ["image"] and info["modalities"]["shapes_strict"] == ["image"]
    assert info["modalities"]["shapes_video_strict"] == ["video"] == info["modalities"]["shapes_video_partial"]
    assert info["uses_prompt"]["brightness"] is False and info["uses_prompt"]["jpeg_compressibility"] is False
    assert info["uses_prompt"]["shapes_strict"] is True and info["uses_prompt"]["shapes_video_strict"] is True


def test_the_builtin_clip_rewards_name_their_scorer_by_one_import_string():
    registry = builtin_rewards()
    for name, mode in [("shapes_video_strict", "strict"), ("shapes_video_partial", "partial")]:
        reward = registry[name]
        assert reward.modalities == ("video",) and reward.max_batch == 32
        assert (reward.fn.target, reward.fn.mode) == ("cosmos_rl.shapes:score_clips", mode)
        assert reward.fn._function is None  # not imported by building the registry
    for name, mode in [("shapes_video_i2v_strict", "strict"), ("shapes_video_i2v_partial", "partial")]:
        assert (registry[name].fn.target, registry[name].fn.mode) == ("cosmos_rl.shapes.first_frame_check:score_i2v_clips", mode)
    clip_rewards = {name for name, reward in registry.items() if reward.modalities == ("video",)}
    world = {"pusht_forward_strict", "pusht_forward_partial"}  # the pusht episode suite's, scoring window keys' clips
    dataset = {"prediction_psnr": "score_psnr", "prediction_ssim": "score_ssim"}  # the lerobot suite's, against recorded windows
    policy = {"pusht_chunk_coverage"}  # the pusht suite's policy-mode reward: each clip's generated action rows executed
    assert clip_rewards == set(suites.builtin_reward_names(clips=True)) == set(VIDEO_SUITE.reward_names()) | world | policy | set(dataset)  # all served
    assert registry["pusht_chunk_coverage"].fn.target == "cosmos_rl.suites.pusht:score_chunk" and registry["pusht_chunk_coverage"].takes_actions
    for name in world:
        assert registry[name].fn.target == "cosmos_rl.suites.pusht:score_forward" and registry[name].fn._function is None
    for name, scorer in dataset.items():
        assert registry[name].fn.target == f"cosmos_rl.suites.lerobot:{scorer}" and registry[name].fn._function is None
    with pytest.raises(ValueError, match="modalities"):
        Reward("x", lambda i, p: [], "x:1", modalities=("audio",))


def test_the_scorer_is_imported_on_first_use():
    """Frames 51, 102, 153 grow brighter at both steps; 51, 153, 102 at one of two: strict 1 and 0,
    partial 1 and 0.5 (the stand-in's rule)."""
    sys.modules.pop("_video_scorer_standin", None)
    rewards = video_rewards(STANDIN)
    assert "_video_scorer_standin" not in sys.modules
    clips = np.stack([_clip(51, 102, 153), _clip(51, 153, 102)])
    assert rewards["shapes_video_strict"](clips, ["a", "b"]) == [1.0, 0.0]
    assert rewards["shapes_video_partial"](clips, ["a", "b"]) == [1.0, 0.5]
    assert "_video_scorer_standin" in sys.modules
    with pytest.raises(ValueError, match=r"\[N, F, H, W, 3\]"):
        rewards["shapes_video_strict"](clips[0], ["a", "b", "c"])
    with pytest.raises(RuntimeError, match="the scorer no_such_module_xyz:f cannot be loaded"):
        ImportedScorer("no_such_module_xyz:f", "strict")(clips, ["a", "b"])


# ----------------------------------------------------------------------------------- scoring
def test_a_clip_reward_gets_the_clips_as_they_are(server):
    client = _client(server.url, "shapes_video_partial")
    client.check_revision(CLIP_RUN)
    assert "scores whole clips" in client.clip_scoring()
    clips = np.stack([_clip(51, 102, 153), _clip(51, 153, 102)])
    before = server.score_requests
    assert client.score(clips, ["a", "b"]) == [1.0, 0.5]
    assert server.score_requests == before + 1


def test_an_image_reward_scores_clips_frame_by_frame(server):
    """brightness of clip A's frames 0.2, 0.4, 1.0 and clip B's 1.0, 1.0, 0.0:
    mean 0.5333 / 0.6667, min 0.2 / 0, frames 0 and 2 only (stride 2) 0.6 / 0.5, first 0.2 / 1, last 1 / 0."""
    clips = np.stack([_clip(51, 102, 255), _clip(255, 255, 0)])
    expected = {
        ("mean", 1): [1.6 / 3, 2 / 3], ("min", 1): [0.2, 0.0], ("mean", 2): [0.6, 0.5],
        ("first", 1): [0.2, 1.0], ("last", 1): [1.0, 0.0],
    }  # fmt: skip
    for (reduce, stride), want in expected.items():
        client = _client(server.url, "brightness", frame_reduce=reduce, frame_stride=stride)
        before = server.score_requests
        assert client.score(clips, ["a", "b"]) == pytest.approx(want, abs=1e-12), (reduce, stride)
        assert server.score_requests == before + 1  # every picked frame of both clips in one request


def test_a_clip_reward_sees_time_and_a_per_frame_image_reward_does_not(server):
    """Frames 0.2 .. 1.0 rising and the same frames shuffled: brightness's mean is 0.6 for both,
    the clip reward 1 and 0."""
    clip = _clip(51, 102, 153, 204, 255)
    clips = np.stack([clip, clip[[3, 0, 4, 1, 2]]])
    assert _client(server.url, "brightness").score(clips, ["a", "a"]) == pytest.approx([0.6, 0.6])
    assert _client(server.url, "shapes_video_strict").score(clips, ["a", "a"]) == [1.0, 0.0]


def test_the_shapes_verifier_scores_each_frame_against_the_per_frame_caption(server):
    """Frames: the circle, the empty background, the circle -> strict 1, 0, 1 per frame: mean 2/3,
    min 0, frames 0 and 2 (stride 2) 1. The video caption is never sent: the verifier's grammar
    would refuse it (400)."""
    circle = render(parse_caption("a red circle"), seed=0)
    clip = np.stack([circle, np.full_like(circle, RGB[BACKGROUND]), circle])[None]
    caption, still = ["a red circle moving left"], {"a red circle moving left": "a red circle"}.get
    for reduce, stride, want in [("mean", 1, 2 / 3), ("min", 1, 0.0), ("mean", 2, 1.0)]:
        client = _client(server.url, "shapes_strict", frame_reduce=reduce, frame_stride=stride)
        assert client.score(clip, caption, per_frame_prompts=still) == pytest.approx([want])
    assert _client(server.url, "shapes_partial").score(clip, caption, per_frame_prompts=["a red circle"]) == pytest.approx([2 / 3])
    with pytest.raises(RewardServiceError, match="HTTP 400"):
        _client(server.url, "shapes_strict").score(clip, caption)  # each frame against the video caption


def test_a_run_s_shapes_image_verifier_scores_each_frame_against_the_static_part(server):
    """A run's built-in shapes image reward (a term with no url) needs no per-frame prompts: each
    frame of the circle, background, circle clip is judged against "a red circle" -> strict 1, 0, 1,
    mean 2/3 (the per-frame test's figure); a colour change is refused by name; images and a
    reward at a url of its own keep their prompts."""
    circle = render(parse_caption("a red circle"), seed=0)
    clip = np.stack([circle, np.full_like(circle, RGB[BACKGROUND]), circle])[None]
    builtin = RewardTerm("rl.reward", "shapes_strict", 1.0, "", REVISION, "", "", 10.0, 0, 0.0, "")
    multi = MultiRewardClient([builtin], [client_for(builtin, server.url, None)])
    try:
        assert multi.score(clip, ["a red circle moving left"]) == {"shapes_strict": pytest.approx([2 / 3])}
        with pytest.raises(UserError, match="'a square turning from red to blue' has none"):
            multi.score(clip, ["a square turning from red to blue"])
        assert multi.score(circle[None], ["a red circle"]) == {"shapes_strict": [1.0]}
    finally:
        multi.close()
    served = RewardTerm("rl.reward", "shapes_strict", 1.0, server.url, REVISION, "", "", 10.0, 0, 0.0, "")
    multi = MultiRewardClient([served], [client_for(served, server.url, None)])
    try:
        with pytest.raises(RewardServiceError, match="HTTP 400"):
            multi.score(clip, ["a red circle moving left"])  # its own service: the clip's caption as it is
    finally:
        multi.close()


def test_a_clip_without_a_per_frame_caption_is_an_error_for_a_reward_that_reads_it(server):
    clip = _clip(51, 102, 153)[None]
    caption = ["a square turning from red to blue"]
    before = server.score_requests
    with pytest.raises(UserError) as err:
        _client(server.url, "shapes_strict").score(clip, caption, per_frame_prompts=[None])
    assert "'shapes_strict'" in str(err.value) and "'a square turning from red to blue' has none" in str(err.value)
    assert server.score_requests == before  # refused here, nothing scored as 0
    assert _client(server.url, "brightness").score(clip, caption, per_frame_prompts=[None]) == pytest.approx([0.4])


def test_a_model_reward_scores_clips_frame_by_frame(tmp_path):
    from _reward_models import tiny_clip_folder

    from cosmos_rl.rewards.models import ClipRewardModel

    model = ClipRewardModel("clipscore", tiny_clip_folder(tmp_path / "clip"))
    registry = {"clipscore": Reward("clipscore", model, model.revision, max_batch=32)}
    frames = np.random.default_rng(0).integers(0, 256, size=(3, 16, 16, 3), dtype=np.uint8)
    per_frame = model(frames, ["a cat"] * 3)
    with RewardServer(revision=REVISION, registry=registry) as srv:
        got = _client(srv.url, "clipscore", frame_reduce="min").score(frames[None], ["a cat running"], ["a cat"])
    assert got == pytest.approx([min(per_frame)], abs=1e-6)


def test_frame_and_clip_requests_stay_within_the_protocol_limits(server, monkeypatch):
    """5 frames at 2 images per request -> 3 requests; 2 clips of 3 frames at 3 frames per request -> 2."""
    monkeypatch.setattr(client_module, "WIRE_LIMITS", Limits(max_images=2, max_request_frames=3))
    before = server.score_requests
    assert _client(server.url, "brightness").score(_clip(51, 102, 153, 204, 255)[None], ["a"]) == pytest.approx([0.6])
    assert server.score_requests == before + 3
    clips = np.stack([_clip(51, 102, 153), _clip(51, 153, 102)])
    assert _client(server.url, "shapes_video_partial").score(clips, ["a", "b"]) == [1.0, 0.5]
    assert server.score_requests == before + 5


def test_several_rewards_score_the_same_clips(server):
    terms = [
        RewardTerm("rl.rewards[0]", "brightness", 1.0, server.url, REVISION, "", "", 10.0, 0, 0.0, "", "min", 1),
        RewardTerm("rl.rewards[1]", "shapes_video_partial", 1.0, server.url, REVISION, "", "", 10.0, 0, 0.0, ""),
    ]
    multi = MultiRewardClient(terms, [client_for(t, t.url, None) for t in terms])
    try:
        multi.check_revisions(CLIP_RUN)
        got = multi.score(np.stack([_clip(51, 153, 102)]), ["a"], per_frame_prompts=["a"])
    finally:
        multi.close()
    assert got == {"brightness": pytest.approx([0.2]), "shapes_video_partial": [0.5]}


# ------------------------------------------------------------------ what a run may ask for
def test_modalities_decide_what_a_run_may_ask(server, caplog):
    with pytest.raises(UserError, match=r"scores as whole clips only \(modalities \['video'\]\), but this run makes images"):
        _client(server.url, "shapes_video_strict").check_revision(IMAGE_RUN)
    with pytest.raises(UserError, match="rl.reward.frame_reduce / rl.reward.frame_stride play no part"):
        _client(server.url, "shapes_video_strict", frame_reduce="min").check_revision(CLIP_RUN)
    with caplog.at_level(logging.WARNING, logger="cosmos_rl.rewards.client"):
        _client(server.url, "brightness", frame_stride=2).check_revision(CLIP_RUN)
    assert "'brightness'" in caplog.text and "is an image reward (its modalities are ['image'])" in caplog.text
    assert "frames 0, 2, 4, ..." in caplog.text
    with pytest.raises(UserError, match="rl.reward: frame_reduce must be one of"):
        _client(server.url, "brightness", frame_reduce="max")


class _OldApp(RewardApp):
    """A service from before clips: its /info says nothing of modalities or prompt use."""

    def info(self) -> dict:
        info = super().info()
        del info["modalities"], info["uses_prompt"]
        return info


class _OldServer(RewardServer):
    app_class = _OldApp


def test_a_service_without_modalities_counts_as_image_only(caplog):
    with _OldServer(revision=REVISION) as old:
        client = _client(old.url, "brightness")
        with caplog.at_level(logging.WARNING, logger="cosmos_rl.rewards.client"):
            client.check_revision(CLIP_RUN)
        assert "its /info lists no modalities, so it counts as image-only" in caplog.text
        clip = _clip(51, 102, 255)[None]
        assert client.score(clip, ["a"]) == pytest.approx([1.6 / 3])
        # Without `uses_prompt` every reward counts as reading its prompt.
        with pytest.raises(UserError, match="has none"):
            client.score(clip, ["a"], per_frame_prompts=[None])
        # Not checked first: the client reads /info itself before it sends a clip.
        assert _client(old.url, "brightness", frame_reduce="last").score(clip, ["a"]) == pytest.approx([1.0])


# ---------------------------------------------------------------------------- the wire, hostile
def test_a_clip_claiming_a_million_frames_is_refused_from_its_length(server):
    """The entries are no PNGs: had any been looked at, the answer would be a 400 naming clips[0][0]."""
    code, error = _post(server.url, {"reward": "shapes_video_strict", "prompts": ["a"], "clips": [["x"] * 1_000_000]})
    assert code == 413
    assert "clips[0] has 1000000 frames, over the limit of 256 frames per clip" in error
    assert requests.get(server.url + "/info", timeout=10).status_code == 200


def _png(side_h: int, side_w: int) -> str:
    return encode_png(np.zeros((side_h, side_w, 3), np.uint8))


@pytest.mark.parametrize("limits, clips, text", [
    (Limits(max_clip_frames=2), [[_png(8, 8)] * 3], "clips[0] has 3 frames, over the limit of 2 frames per clip"),
    (Limits(max_request_frames=5), [[_png(8, 8)] * 3] * 2, "clips[0..1] hold 6 frames, over the limit of 5 per request"),
    (Limits(max_side=64), [[_png(8, 8), _png(8, 80)]], "clips[0][1] is 80x8, over the side limit of 64"),
    (Limits(max_pixels=100), [[_png(8, 8), _png(8, 80)]], "clips[0][1] has 640 pixels, over the limit of 100"),
    (Limits(max_request_pixels=100), [[_png(8, 8)] * 2], "the request's frames hold 128 pixels, over the limit of 100"),
], ids=["clip_frames", "request_frames", "frame_side", "frame_pixels", "request_pixels"])  # fmt: skip
def test_each_clip_limit_answers_413(limits, clips, text):
    with RewardServer(revision=REVISION, limits=limits, registry=_registry()) as srv:
        code, error = _post(srv.url, {"reward": "shapes_video_strict", "prompts": ["a"] * len(clips), "clips": clips})
    assert code == 413 and text in error, error


def _truncated_png() -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()[:-40]).decode()  # the header intact, the pixels cut


OK = _png(8, 8)
MALFORMED_CLIPS = {  # name: (reward, prompts, clips or other fields, what the error must say)
    "clips_number": ("shapes_video_strict", ["a"], {"clips": 3}, "clips must be a list of clips"),
    "clip_string": ("shapes_video_strict", ["a"], {"clips": ["x"]}, "clips[0] must be a list of base64 PNG frames"),
    "frame_number": ("shapes_video_strict", ["a"], {"clips": [[OK, 7]]}, "clips[0][1] must be a base64 string"),
    "frame_not_png": ("shapes_video_strict", ["a"], {"clips": [[OK, "eA=="]]}, "clips[0][1] is not a base64-encoded PNG"),
    "frame_truncated": ("shapes_video_strict", ["a"], {"clips": [[OK, _truncated_png()]]}, "clips[0][1] does not decode"),
    "no_clips": ("shapes_video_strict", [], {"clips": []}, "clips is empty"),
    "empty_clip": ("shapes_video_strict", ["a"], {"clips": [[]]}, "clips[0] has no frames"),
    "frame_counts": ("shapes_video_strict", ["a", "b"], {"clips": [[OK, OK], [OK]]}, "clips[1] has 1 frames but clips[0] has 2"),
    "count_mismatch": ("shapes_video_strict", ["a", "b"], {"clips": [[OK]]}, "got 1 clips but 2 prompts"),
    "frame_sizes": ("shapes_video_strict", ["a"], {"clips": [[OK, _png(8, 16)]]}, "all frames in one request must share a size"),
    "both": ("shapes_video_strict", ["a"], {"clips": [[OK]], "images": [OK]}, "not both"),
    "clips_to_an_image_reward": ("brightness", ["a"], {"clips": [[OK]]}, "reward 'brightness' does not score clips (its modalities are ['image'])"),
    "images_to_a_clip_reward": ("shapes_video_strict", ["a"], {"images": [OK]}, "reward 'shapes_video_strict' does not score images"),
    "neither": ("brightness", ["a"], {}, "missing fields ['images']; send images, or clips"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_CLIPS))
def test_every_malformed_clip_field_is_a_400_naming_it(name, server):
    reward, prompts, fields, text = MALFORMED_CLIPS[name]
    code, error = _post(server.url, {"reward": reward, "prompts": prompts, **fields})
    assert code == 400 and text in error, (code, error)


# ------------------------------------------------------------------------- run identity
def test_the_frame_keys_at_their_defaults_leave_run_identities_alone():
    one = load.load(NFT)
    several = load.load(NFT, ["rl.reward={}", 'rl.rewards=[{name="brightness", revision="b"}, {name="prompt_colour", revision="p"}]'])
    for config in (one, several):
        assert not [k for k in plan.identity_fields(config) if "frame_" in k]
    strided = attrs.evolve(one, rl=attrs.evolve(one.rl, reward=attrs.evolve(one.rl.reward, frame_stride=2)))
    assert plan.identity_fields(strided)["rl.reward.frame_stride"] == 2
    assert plan.run_identity(strided) != plan.run_identity(one)
    term = attrs.evolve(several.rl.rewards[1], frame_reduce="min")
    reduced = attrs.evolve(several, rl=attrs.evolve(several.rl, rewards=[several.rl.rewards[0], term]))
    assert plan.identity_fields(reduced)["rl.rewards[1].frame_reduce"] == "min"


def test_a_saved_run_of_another_algorithm_gains_no_reward_table():
    raw = with_later_knobs({"rl": {"algorithm": "dpo"}, "model": {}})
    assert "reward" not in raw["rl"] and "rewards" not in raw["rl"]
