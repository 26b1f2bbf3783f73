"""Model rewards from local folders: scores against transformers' own forward, revisions, safetensors only."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import CLIPModel, CLIPProcessor
from typer.testing import CliRunner

from _reward_models import head_state, tiny_aesthetic_folder, tiny_clip_folder
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.cli import app
from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.client import RewardClient
from cosmos_rl.rewards.models import ClipRewardModel, convert_head, head_layers
from cosmos_rl.rewards.registry import parse_model_specs
from cosmos_rl.rewards.server import RewardServer

IMAGE_RUN = MediaSpec.image(32)  # what a run makes; check_revision asks only images or clips
PROMPTS = ["a red cube", "blue sky", "green"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return tiny_clip_folder(tmp_path_factory.mktemp("clip") / "clip")


@pytest.fixture(scope="module")
def aesthetic_dir(tmp_path_factory):
    return tiny_aesthetic_folder(tmp_path_factory.mktemp("aesthetic") / "aesthetic")


def _images(n=3, side=40):
    return np.random.default_rng(3).integers(0, 256, (n, side, side + 8, 3), dtype=np.uint8)


def _reference(folder, images, prompts):
    """transformers' CLIPModel forward: logits_per_image [N, N] and the image embeddings."""
    model = CLIPModel.from_pretrained(folder, use_safetensors=True).eval()
    processor = CLIPProcessor.from_pretrained(folder)
    inputs = processor(text=prompts, images=list(images), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**inputs)
    return out.logits_per_image, out.image_embeds, model.logit_scale.exp()


def test_pickscore_is_the_logits_per_image_diagonal(clip_dir):
    images = _images()
    logits, _, _ = _reference(clip_dir, images, PROMPTS)
    got = ClipRewardModel("pickscore", clip_dir)(images, PROMPTS)
    assert got == pytest.approx(torch.diagonal(logits).tolist(), rel=1e-5, abs=1e-5)


def test_clipscore_is_2_5_times_the_clipped_cosine(clip_dir):
    images, prompts = _images(6), [*PROMPTS, "yellow", "a cat", "dog"]
    logits, _, scale = _reference(clip_dir, images, prompts)
    cosine = (torch.diagonal(logits) / scale).detach()
    expected = [2.5 * max(float(c), 0.0) for c in cosine]
    got = ClipRewardModel("clipscore", clip_dir)(images, prompts)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert min(cosine) < 0 < max(cosine)  # both sides of the clip are exercised by these seeds


def test_aesthetic_is_the_head_on_the_normalised_image_embedding(aesthetic_dir):
    images = _images()
    _, embeds, _ = _reference(aesthetic_dir, images, PROMPTS)
    x = embeds / embeds.norm(dim=-1, keepdim=True)
    state = head_state(0)
    for i in (0, 2, 4):  # the head's three Linear layers, no activation between them
        x = x @ state[f"layers.{i}.weight"].T + state[f"layers.{i}.bias"]
    got = ClipRewardModel("aesthetic", aesthetic_dir)(images, ["unused"] * 3)
    assert got == pytest.approx(x[:, 0].tolist(), rel=1e-5, abs=1e-5)


def test_revision_hashes_the_weights(clip_dir, tmp_path):
    first = ClipRewardModel("pickscore", clip_dir).revision
    assert first.startswith("pickscore:sha256-") and len(first) == len("pickscore:sha256-") + 16
    copy = shutil.copytree(clip_dir, tmp_path / "copy")
    assert ClipRewardModel("pickscore", copy).revision == first  # same bytes, same revision wherever
    state = load_file(str(copy / "model.safetensors"))
    key = next(iter(state))
    state[key] = state[key] + 1e-3
    save_file(state, str(copy / "model.safetensors"), metadata={"format": "pt"})
    assert ClipRewardModel("pickscore", copy).revision != first


def test_pickled_weights_are_never_loaded(clip_dir, tmp_path):
    folder = shutil.copytree(clip_dir, tmp_path / "bin_only")
    model = CLIPModel.from_pretrained(folder, use_safetensors=True)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(UserError, match="no .safetensors weights"):
        ClipRewardModel("pickscore", folder)
    with pytest.raises(UserError, match="folder not found"):
        ClipRewardModel("clipscore", tmp_path / "nope")


def test_aesthetic_needs_its_head_and_a_matching_width(clip_dir, tmp_path):
    with pytest.raises(UserError, match="convert-head"):
        ClipRewardModel("aesthetic", clip_dir)
    folder = shutil.copytree(clip_dir, tmp_path / "wide")
    save_file({"weight": torch.zeros(1, 5), "bias": torch.zeros(1)}, str(folder / "aesthetic_head.safetensors"))
    with pytest.raises(UserError, match="5-wide"):
        ClipRewardModel("aesthetic", folder)


def test_head_layers_single_linear_and_bad_heads():
    one = head_layers({"weight": torch.ones(1, 3), "bias": torch.zeros(1)})
    assert len(one) == 1
    with pytest.raises(ValueError, match="do not chain"):
        head_layers({"l.0.weight": torch.ones(4, 3), "l.0.bias": torch.ones(4), "l.1.weight": torch.ones(1, 5), "l.1.bias": torch.ones(1)})
    with pytest.raises(ValueError, match="one score"):
        head_layers({"weight": torch.ones(2, 3), "bias": torch.zeros(2)})
    with pytest.raises(ValueError, match="unexpected tensor"):
        head_layers({"running_mean": torch.ones(3)})


class _Payload:
    """Unpickling this runs code (a __reduce__), which weights_only loading refuses."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_convert_head_reads_weights_only(tmp_path, capsys):
    state = head_state(1)
    torch.save({"state_dict": state}, tmp_path / "head.pth")
    target = tmp_path / "out" / "aesthetic_head.safetensors"
    result = CliRunner().invoke(app, ["reward", "convert-head", str(tmp_path / "head.pth"), str(target)])
    assert result.exit_code == 0, result.output
    back = load_file(str(target))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)

    torch.save({"layers.0.weight": _Payload()}, tmp_path / "evil.pth")
    with pytest.raises(UserError, match="not a weights-only checkpoint"):
        convert_head(tmp_path / "evil.pth", tmp_path / "evil.safetensors")
    assert "this must never run" not in capsys.readouterr().out
    assert not (tmp_path / "evil.safetensors").exists()


def test_model_specs():
    assert parse_model_specs(["pickscore=/a", "aesthetic=/b"]) == {"pickscore": "/a", "aesthetic": "/b"}
    for bad, text in [("pickscore", "NAME=FOLDER"), ("hpsv2=/x", "unknown model reward"), ("=/x", "NAME=FOLDER")]:
        with pytest.raises(UserError, match=text):
            parse_model_specs([bad])
    with pytest.raises(UserError, match="twice"):
        parse_model_specs(["clipscore=/a", "clipscore=/b"])


def test_served_with_its_revision_and_pinned_by_it(clip_dir):
    images = _images(2, 24)
    direct = ClipRewardModel("pickscore", clip_dir)
    with RewardServer(revision="m-1", models={"pickscore": str(clip_dir)}) as server:
        pin = RewardClient(server.url, "pickscore", "m-1", 10, 0, 0.0, expected_reward_revision=direct.revision)
        info = pin.check_revision(IMAGE_RUN)
        assert info["revisions"]["pickscore"] == direct.revision
        assert info["revisions"]["brightness"] == "brightness:builtin-1"
        assert pin.score(images, PROMPTS[:2]) == pytest.approx(direct(images, PROMPTS[:2]), rel=1e-6)
        stale = RewardClient(server.url, "pickscore", "m-1", 10, 0, 0.0, key="rl.rewards[0]",
                             expected_reward_revision="pickscore:sha256-0000000000000000")  # fmt: skip
        with pytest.raises(UserError, match=r"rl.rewards\[0\].reward_revision .*weights changed"):
            stale.check_revision(IMAGE_RUN)
