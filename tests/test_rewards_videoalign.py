"""VideoAlign from a local folder: Qwen2-VL video patches against an independent computation, the
scores against the head at the reward tokens, named dimensions through the service and client,
and the folder problems a user can cause."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from _reward_models import VA_PIXELS, VA_SETTINGS, tiny_videoalign_folder
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.rewards.client import RewardClient
from cosmos_rl.rewards.multi import MultiRewardClient, RewardTerm
from cosmos_rl.rewards.registry import parse_model_specs
from cosmos_rl.rewards.server import RewardServer
from cosmos_rl.rewards.videoalign import CLIP_MEAN, CLIP_STD, VideoAlignReward, frame_size, video_patches

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["a red circle moving left", "a blue square", "green"]
VIDEO_RUN = MediaSpec(frames=5, height=32, width=32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_videoalign_folder(tmp_path_factory.mktemp("videoalign") / "videoalign")


@pytest.fixture(scope="module")
def reward(folder):
    return VideoAlignReward(folder, device="cpu")


def _clips(n=3, frames=5, side=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, frames, side, side, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------ video input
def test_video_patches_of_a_still_pair_are_the_pil_image_processors_patches():
    """Qwen2-VL's image processor repeats an image over the temporal patch: a clip of two equal frames
    must give exactly its patches and grid, resize to the pixel budget included (40x60 -> 28x56)."""
    from transformers import Qwen2VLImageProcessorPil

    frame = np.random.default_rng(1).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    budget = dict(min_pixels=28 * 28, max_pixels=28 * 28 * 2)
    expected = Qwen2VLImageProcessorPil(**budget)(images=[frame], return_tensors="np")
    patches, grid = video_patches(np.stack([frame, frame]), **budget)
    assert list(grid) == expected["image_grid_thw"][0].tolist() == [1, 2, 4]
    np.testing.assert_allclose(patches, expected["pixel_values"], rtol=0, atol=1e-5)


def test_video_patches_by_hand_on_a_two_frame_28x28_clip():
    """No resize (28x28 is on the grid): each row is one 14x14 patch of both frames, in merge order."""
    clip = np.random.default_rng(2).integers(0, 256, (2, 28, 28, 3), dtype=np.uint8)
    patches, grid = video_patches(clip, min_pixels=28 * 28, max_pixels=28 * 28)
    assert grid == (1, 2, 2) and patches.shape == (4, 3 * 2 * 14 * 14)
    for row, (py, px) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):  # one 2x2 merge block, row-major
        for c in range(3):
            for t in range(2):
                for y in (0, 5, 13):
                    for x in (0, 7, 13):
                        want = (clip[t, py * 14 + y, px * 14 + x, c] / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]
                        assert patches[row, c * 392 + t * 196 + y * 14 + x] == pytest.approx(want, abs=1e-5)


def test_an_odd_frame_count_repeats_the_last_frame_and_the_budget_holds():
    clip = _clips(1, 3)[0]
    patches, grid = video_patches(clip, min_pixels=784, max_pixels=784)
    again, _ = video_patches(np.concatenate([clip, clip[-1:]]), min_pixels=784, max_pixels=784)
    assert grid == (2, 2, 2) and np.array_equal(patches, again)
    # the release's defaults: a 32x32 frame is brought up to Qwen2-VL's video minimum (128 x 28 x 28 pixels)
    assert frame_size(32, 32, 128 * 784, 448 * 448) == (336, 336)
    # 1080p: scale sqrt(1080 x 1920 / 200704) = 3.214; 1080 / 3.214 = 336.0 -> 336, 1920 / 3.214 = 597.3 -> 588
    assert frame_size(1080, 1920, 784, 448 * 448) == (336, 588)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    for h, w in [(32, 48), (480, 832), (720, 1280), (29, 300)]:
        assert frame_size(h, w, 784, 448 * 448) == smart_resize(h, w, 28, 784, 448 * 448)


# ------------------------------------------------------------------------------ scores
def test_scores_are_the_head_at_the_reward_tokens_standardised_and_summed(folder, reward):
    clips = _clips()
    scored = reward(clips, PROMPTS)
    head = load_file(str(folder / "rm_head.safetensors"))["rm_head.weight"]  # [1, hidden]
    names = ("vq", "mq", "ta")
    for i, prompt in enumerate(PROMPTS):
        batch = reward.inputs(clips[i : i + 1], [prompt])
        ids = batch["input_ids"][0].tolist()
        # the reward tokens' positions found here from the tokenizer's own ids, one each
        positions = [ids.index(reward.tokenizer.convert_tokens_to_ids(t)) for t in ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")]
        assert positions == sorted(positions)
        with torch.no_grad():
            hidden = reward.model.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], mm_token_type_ids=batch["mm_token_type_ids"],
                pixel_values_videos=batch["pixel_values_videos"], video_grid_thw=batch["video_grid_thw"],
            ).last_hidden_state[0]  # fmt: skip
        raw = [float(hidden[p] @ head[0]) for p in positions]
        want = [(raw[k] - VA_SETTINGS[f"{n.upper()}_mean"]) / VA_SETTINGS[f"{n.upper()}_std"] for k, n in enumerate(names)]
        for k, n in enumerate(names):
            assert scored.dimensions[n][i] == pytest.approx(want[k], rel=1e-4, abs=1e-5)
        assert scored.scores[i] == pytest.approx(sum(want), rel=1e-4, abs=1e-5)  # Overall = VQ + MQ + TA


def test_a_batch_scores_each_clip_as_alone_and_the_prompt_moves_text_alignment(reward):
    clips = _clips()
    together = reward(clips, PROMPTS)
    for i in range(3):  # right-padding of shorter prompts changes nothing before the pad
        alone = reward(clips[i : i + 1], PROMPTS[i : i + 1])
        assert alone.scores[0] == pytest.approx(together.scores[i], rel=1e-4, abs=1e-5)
    other = reward(clips[:1], ["something else entirely"])
    # VQ and MQ read the tokens before the prompt (a causal model): unchanged; TA reads it
    assert other.dimensions["vq"][0] == pytest.approx(together.dimensions["vq"][0], rel=1e-5)
    assert other.dimensions["ta"][0] != pytest.approx(together.dimensions["ta"][0], rel=1e-3)


def test_revision_hashes_the_head_settings_and_template(folder, reward, tmp_path):
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    assert VideoAlignReward(copy, device="cpu").revision == reward.revision
    (copy / "prompt_template.txt").write_text((copy / "prompt_template.txt").read_text() + " ")
    assert VideoAlignReward(copy, device="cpu").revision != reward.revision


# ------------------------------------------------------------------------------ folder problems
def _broken(folder: Path, tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(folder, tmp_path / name))


def test_folder_problems_name_the_file_what_and_the_fix(folder, tmp_path):
    def refused(path, pattern):
        with pytest.raises(UserError, match=pattern):
            VideoAlignReward(path, device="cpu")

    no_head = _broken(folder, tmp_path, "no_head")
    (no_head / "rm_head.safetensors").unlink()
    refused(no_head, r"--model videoalign=.*no_head: no tensor rm_head.weight in any .safetensors file .*merge the release's LoRA")

    wide = _broken(folder, tmp_path, "wide")
    save_file({"rm_head.weight": torch.zeros(3, 32)}, str(wide / "rm_head.safetensors"))
    refused(wide, r"rm_head.safetensors rm_head.weight has shape \[3, 32\], expected \[1, 32\]")

    bins = _broken(folder, tmp_path, "bins")
    for path in bins.glob("*.safetensors"):
        path.rename(path.with_suffix(".bin"))
    refused(bins, r"bins: no .safetensors weights in the folder \(pickled .bin/.pth weights are never loaded\); re-save")

    no_settings = _broken(folder, tmp_path, "no_settings")
    (no_settings / "model_config.json").unlink()
    refused(no_settings, r"no model_config.json .*; copy model_config.json from the released VideoReward folder")

    bad_norm = _broken(folder, tmp_path, "bad_norm")
    (bad_norm / "model_config.json").write_text('{"data_config": {}, "inference_config": {"VQ_mean": 1}}')
    refused(bad_norm, r"inference_config needs finite VQ_mean, .*\(bad: VQ_std, MQ_mean")

    no_tokens = _broken(folder, tmp_path, "no_tokens")
    (no_tokens / "prompt_template.txt").write_text("rate {text_prompt}")
    refused(no_tokens, r"prompt_template.txt must hold \{text_prompt\} once and .* found counts .*write the release's `detailed_special`")

    other = _broken(folder, tmp_path, "other")
    (other / "config.json").write_text('{"model_type": "clip"}')
    refused(other, r"config.json model_type is 'clip', not 'qwen2_vl'")


def test_model_specs_and_prompts_holding_reward_tokens(reward):
    assert parse_model_specs(["videoalign=/m"]) == {"videoalign": "/m"}
    with pytest.raises(ValueError, match="may not contain the reward tokens"):
        reward(_clips(1), ["sneaky <|TA_reward|>"])


# ------------------------------------------------------------------------------ served
def test_served_with_its_dimensions_and_single_value_rewards_unchanged(folder, reward):
    clips = _clips(2)
    direct = reward(clips, PROMPTS[:2])
    with RewardServer(revision="va-1", models={"videoalign": str(folder)}) as server:
        client = RewardClient(server.url, "videoalign", "va-1", 60, 0, 0.0, expected_reward_revision=reward.revision)
        info = client.check_revision(VIDEO_RUN)
        assert info["modalities"]["videoalign"] == ["video"] and info["dimensions"] == {"videoalign": ["vq", "mq", "ta"]}
        scores, dims = client.score_dimensions(clips, PROMPTS[:2])
        assert scores == pytest.approx(direct.scores, rel=1e-6) and client.score(clips, PROMPTS[:2]) == scores
        assert dims == {k: pytest.approx(v, rel=1e-6) for k, v in direct.dimensions.items()}
        import requests

        plain = requests.post(f"{server.url}/score", json={"reward": "brightness", "prompts": ["x"], "images": [_png()]}).json()
        assert sorted(plain) == ["revision", "reward_revision", "scores"]  # no dimensions key for a single-value reward
        terms = [RewardTerm(f"rl.rewards[{i}]", n, 1.0, server.url, "va-1", "", "", 60, 0, 0.0, "") for i, n in enumerate(["brightness", "videoalign"])]
        multi = MultiRewardClient(terms, [RewardClient(server.url, t.name, "va-1", 60, 0, 0.0) for t in terms])
        try:
            assert multi.dimension_names() == ["videoalign.mq", "videoalign.ta", "videoalign.vq"]
            by_name, by_dim = multi.score_dimensions(clips, PROMPTS[:2])
            assert sorted(by_name) == ["brightness", "videoalign"] and by_dim["videoalign.ta"] == dims["ta"]
        finally:
            multi.close()
        # rl.rewards[].dimensions: the score becomes the weighted sum of the named dimensions
        weighted = RewardClient(server.url, "videoalign", "va-1", 60, 0, 0.0, key="rl.rewards[0]", dimension_weights={"vq": 1.0, "mq": 2.0})
        weighted.check_revision(VIDEO_RUN)
        mixed, _ = weighted.score_dimensions(clips, PROMPTS[:2])
        assert mixed == pytest.approx([v + 2 * m for v, m in zip(direct.dimensions["vq"], direct.dimensions["mq"])], rel=1e-6)
        wrong = RewardClient(server.url, "videoalign", "va-1", 60, 0, 0.0, key="rl.rewards[0]", dimension_weights={"quality": 1.0})
        with pytest.raises(UserError, match=r"^rl.rewards\[0\].dimensions names \['quality'\], which the service at .* lists \['vq', 'mq', 'ta'\]"):
            wrong.check_revision(VIDEO_RUN)
    with RewardServer(revision="plain") as server:
        assert "dimensions" not in RewardClient(server.url, "brightness", "plain", 10, 0, 0.0).info()


def _png() -> str:
    from cosmos_rl.rewards.client import encode_png

    return encode_png(np.zeros((8, 8, 3), dtype=np.uint8))


def test_cosmos_rl_reward_serve_scores_videoalign_from_a_folder(folder, reward):
    """The command an operator runs: `cosmos-rl reward serve --model videoalign=FOLDER` on a free loopback port."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "cosmos_rl.cli", "reward", "serve", "--revision", "va-cli", "--host", "127.0.0.1",
                             "--port", "0", "--model", f"videoalign={folder}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", "".join(lines))
        assert found, "".join(lines)
        assert reward.revision in lines[-1]  # the model's revision is printed for pinning
        client = RewardClient(found.group(1), "videoalign", "va-cli", 60, 0, 0.0, expected_reward_revision=reward.revision)
        client.check_revision(VIDEO_RUN)
        clips = _clips(1)
        scores, dims = client.score_dimensions(clips, PROMPTS[:1])
        assert scores == pytest.approx(reward(clips, PROMPTS[:1]).scores, rel=1e-5) and sorted(dims) == ["mq", "ta", "vq"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_eval_scores_the_overall_and_reports_each_dimensions_mean(folder, reward):
    """`cosmos-rl eval --reward videoalign=FOLDER`'s scorer: the weighted Overall per clip, and each
    dimension's mean over the clips scored since it was last asked (eval.json `reward_dimensions`)."""
    from cosmos_rl.evaluation.served import ServedRewards, served_terms

    clips = _clips(2)
    direct = reward(clips, PROMPTS[:2])
    with ServedRewards(served_terms([f"videoalign={folder}"]), VIDEO_RUN) as served:
        assert served.score(clips, PROMPTS[:2]) == pytest.approx(direct.scores, rel=1e-6)
        means = served.take_dimensions()
        assert sorted(means) == ["videoalign.mq", "videoalign.ta", "videoalign.vq"]
        assert means["videoalign.ta"] == pytest.approx(float(np.mean(direct.dimensions["ta"])), rel=1e-6)
        assert served.take_dimensions() is None  # taken: the next model's scoring starts afresh
