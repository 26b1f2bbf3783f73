"""HPSv2.1 (`hps`): the open_clip checkpoint converted to transformers' CLIP, checked against an
open_clip-layout forward written here; HPSv2's resize-and-pad preprocessing; the score; the service."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import CLIPModel, CLIPTokenizer
from typer.testing import CliRunner

from _reward_models import OPENCLIP_TINY, OPENCLIP_VIT_H_14, SIDE, eot_last_tokenizer, openclip_state, tiny_clip_folder
from cosmos_rl.cli import app
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.rewards.client import RewardClient
from cosmos_rl.rewards.hps import hps_pixels
from cosmos_rl.rewards.hps_convert import convert_hps, infer_config, openclip_to_transformers
from cosmos_rl.rewards.models import ClipRewardModel

# OpenAI CLIP's mean/std, as HPSv2 normalises (open_clip's OPENAI_DATASET_MEAN/STD)
MEAN, STD = np.array([0.48145466, 0.4578275, 0.40821073]), np.array([0.26862954, 0.26130258, 0.27577711])
HEADS = dict(vision_heads=OPENCLIP_TINY["vision_heads"], text_heads=OPENCLIP_TINY["text_heads"])
PROMPTS = ["a red cube", "blue sky", "green grass at dusk"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return eot_last_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": openclip_state(0)}, path)  # nested as the release is
    return path


@pytest.fixture(scope="module")
def hps_dir(tmp_path_factory, source, tokenizer_dir):
    folder = tmp_path_factory.mktemp("hps") / "hps"
    convert_hps(source, folder, tokenizer_dir, **HEADS)
    return folder


# ------------------------------------------------------------------------------ open_clip layout forward
def _blocks(x, state, prefix, layers, heads, quick_gelu, mask=None):
    """open_clip's residual attention blocks: x + attn(ln_1(x)), then x + c_proj(act(c_fc(ln_2(x))))."""
    width = x.shape[-1]
    for i in range(layers):
        p = f"{prefix}transformer.resblocks.{i}."
        attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        attn.load_state_dict({"in_proj_weight": state[p + "attn.in_proj_weight"], "in_proj_bias": state[p + "attn.in_proj_bias"],
                              "out_proj.weight": state[p + "attn.out_proj.weight"], "out_proj.bias": state[p + "attn.out_proj.bias"]})  # fmt: skip
        h = F.layer_norm(x, (width,), state[p + "ln_1.weight"], state[p + "ln_1.bias"])
        x = x + attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        h = F.layer_norm(x, (width,), state[p + "ln_2.weight"], state[p + "ln_2.bias"])
        h = F.linear(h, state[p + "mlp.c_fc.weight"], state[p + "mlp.c_fc.bias"])
        h = h * torch.sigmoid(1.702 * h) if quick_gelu else F.gelu(h)
        x = x + F.linear(h, state[p + "mlp.c_proj.weight"], state[p + "mlp.c_proj.bias"])
    return x


def _openclip_image(state, pixels, quick_gelu):
    d = OPENCLIP_TINY
    x = F.conv2d(pixels, state["visual.conv1.weight"], stride=d["patch"])  # [N, W, g, g]
    x = x.flatten(2).transpose(1, 2)
    cls = state["visual.class_embedding"].expand(x.shape[0], 1, -1)
    x = torch.cat([cls, x], dim=1) + state["visual.positional_embedding"]
    x = F.layer_norm(x, (d["vision_width"],), state["visual.ln_pre.weight"], state["visual.ln_pre.bias"])
    x = _blocks(x, state, "visual.", d["vision_layers"], d["vision_heads"], quick_gelu)
    x = F.layer_norm(x[:, 0], (d["vision_width"],), state["visual.ln_post.weight"], state["visual.ln_post.bias"])
    return x @ state["visual.proj"]


def _openclip_text(state, ids, quick_gelu):
    d, length = OPENCLIP_TINY, ids.shape[1]
    x = state["token_embedding.weight"][ids] + state["positional_embedding"][:length]
    causal = torch.full((length, length), float("-inf")).triu(1)
    x = _blocks(x, state, "", d["text_layers"], d["text_heads"], quick_gelu, mask=causal)
    x = F.layer_norm(x, (d["text_width"],), state["ln_final.weight"], state["ln_final.bias"])
    return x[torch.arange(len(ids)), ids.argmax(dim=-1)] @ state["text_projection"]  # pooled at the end-of-text token


def _openclip_ids(tokenizer, prompts):
    """Token ids as open_clip's tokenizer pads them: zeros after the end-of-text token."""
    tokens = tokenizer(prompts, padding=True, truncation=True, max_length=OPENCLIP_TINY["context"], return_tensors="pt")
    ids = tokens["input_ids"]
    after_eot = torch.arange(ids.shape[1]) > (ids == tokenizer.eos_token_id).int().argmax(dim=1, keepdim=True)
    return ids.masked_fill(after_eot, 0), tokens


def _transformers_embeddings(folder, pixels, tokens):
    model = CLIPModel.from_pretrained(folder, use_safetensors=True).eval()
    with torch.no_grad():
        img = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        txt = model.text_projection(model.text_model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]).pooler_output)
    return img, txt


@pytest.mark.parametrize("quick_gelu", [False, True])
def test_converted_folder_matches_the_open_clip_forward(tmp_path, tokenizer_dir, quick_gelu):
    state = openclip_state(1)
    torch.save(state, tmp_path / "plain.pt")  # a bare state dict converts too
    convert_hps(tmp_path / "plain.pt", tmp_path / "out", tokenizer_dir, quick_gelu=quick_gelu, **HEADS)
    pixels = torch.randn(3, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(2))
    openclip_ids, hf_tokens = _openclip_ids(CLIPTokenizer.from_pretrained(tokenizer_dir), PROMPTS)
    img, txt = _transformers_embeddings(tmp_path / "out", pixels, hf_tokens)
    with torch.no_grad():
        ref_img, ref_txt = _openclip_image(state, pixels, quick_gelu), _openclip_text(state, openclip_ids, quick_gelu)
    assert torch.allclose(img, ref_img, atol=1e-5, rtol=0)
    assert torch.allclose(txt, ref_txt, atol=1e-5, rtol=0)
    assert ref_img.abs().max() > 0.1 and ref_txt.abs().max() > 0.1  # embeddings with values, not all near zero


def test_vit_h_14_layout_maps_whole_with_the_default_heads():
    """The release's full-size layout (shapes only, no memory): the config is ViT-H-14's and every
    tensor lands at the shape transformers' CLIPModel of that config holds."""
    from pathlib import Path

    from transformers import CLIPConfig

    state = openclip_state(dims=OPENCLIP_VIT_H_14, meta=True)
    config = infer_config(state, Path("HPS_v2.1_compressed.pt"), vision_heads=16, text_heads=16, quick_gelu=False)
    vision, text = config["vision_config"], config["text_config"]
    assert (vision["hidden_size"], vision["num_hidden_layers"], vision["intermediate_size"], vision["patch_size"], vision["image_size"]) == (1280, 32, 5120, 14, 224)
    assert (text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"], text["vocab_size"], text["max_position_embeddings"]) == (1024, 24, 4096, 49408, 77)
    assert config["projection_dim"] == 1024 and vision["hidden_act"] == text["hidden_act"] == "gelu"
    tensors, _ = openclip_to_transformers(state, config)
    with torch.device("meta"):
        model = CLIPModel(CLIPConfig.from_dict(config))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------ preprocessing and score
def _hpsv2_preprocess(image, side):
    """HPSv2's validation transform, restated: longer side to `side` (PIL bicubic), centred on black, mean/std."""
    h, w = image.shape[:2]
    scale = side / max(h, w)
    nh, nw = round(h * scale), round(w * scale)
    small = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BICUBIC), dtype=np.float64) / 255
    canvas = np.zeros((side, side, 3))
    canvas[(side - nh) // 2 : (side - nh) // 2 + nh, (side - nw) // 2 : (side - nw) // 2 + nw] = small
    return torch.tensor(((canvas - MEAN) / STD).transpose(2, 0, 1), dtype=torch.float32)


def test_hps_pixels_pads_the_short_side_with_black():
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 256, (16, 32, 3), dtype=np.uint8)  # longer side already 32: padded only
    tall = rng.integers(0, 256, (40, 26, 3), dtype=np.uint8)  # 40 -> 32, 26 -> round(20.8) = 21: 11 columns of padding
    got = hps_pixels(np.stack([wide]), 32, MEAN, STD)[0].numpy()
    black = (-MEAN / STD)[:, None, None]
    assert np.allclose(got[:, :8], black, atol=1e-6) and np.allclose(got[:, 24:], black, atol=1e-6)
    assert np.allclose(got[:, 8:24], ((wide / 255 - MEAN) / STD).transpose(2, 0, 1), atol=1e-6)
    got = hps_pixels(tall[None], 32, MEAN, STD)[0].numpy()
    assert np.allclose(got[:, :, :5], black, atol=1e-6) and np.allclose(got[:, :, 26:], black, atol=1e-6)
    small = np.asarray(Image.fromarray(tall).resize((21, 32), Image.BICUBIC)) / 255
    assert np.allclose(got[:, :, 5:26], ((small - MEAN) / STD).transpose(2, 0, 1), atol=1e-6)


def test_hps_is_the_cosine_of_hpsv2_preprocessed_embeddings(hps_dir, tokenizer_dir):
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (3, 24, 48, 3), dtype=np.uint8)  # wide frames: a centre crop would cut them
    pixels = torch.stack([_hpsv2_preprocess(im, SIDE) for im in images])
    _, hf_tokens = _openclip_ids(CLIPTokenizer.from_pretrained(tokenizer_dir), PROMPTS)
    img, txt = _transformers_embeddings(hps_dir, pixels, hf_tokens)
    expected = (F.normalize(img, dim=-1) * F.normalize(txt, dim=-1)).sum(-1)
    model = ClipRewardModel("hps", hps_dir)
    assert model(images, PROMPTS) == pytest.approx(expected.tolist(), abs=1e-5)
    assert model.revision.startswith("hps:sha256-")
    assert all(-1 <= s <= 1 for s in model(images, PROMPTS))  # a cosine: no logit scale


# ------------------------------------------------------------------------------ the converter's refusals
def _save(path, state):
    torch.save({"state_dict": state}, path)
    return path


class _Payload:
    """Unpickling this runs code (a __reduce__), which weights_only loading refuses."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_convert_names_missing_and_leftover_tensors(tmp_path, tokenizer_dir):
    state = openclip_state(0)
    del state["transformer.resblocks.1.ln_2.bias"]
    with pytest.raises(UserError, match=r"missing 1 tensor\(s\) \['transformer.resblocks.1.ln_2.bias'\]"):
        convert_hps(_save(tmp_path / "a.pt", state), tmp_path / "a", tokenizer_dir, **HEADS)
    state = openclip_state(0) | {"logit_bias": torch.zeros(())}
    with pytest.raises(UserError, match=r"no CLIP part takes \['logit_bias'\]"):
        convert_hps(_save(tmp_path / "b.pt", state), tmp_path / "b", tokenizer_dir, **HEADS)
    state = openclip_state(0)
    state["visual.proj"] = torch.zeros(16, 5)  # 5-wide image embeddings beside 8-wide text ones
    with pytest.raises(UserError, match=r"'visual.proj' is shaped \(5, 16\)"):
        convert_hps(_save(tmp_path / "c.pt", state), tmp_path / "c", tokenizer_dir, **HEADS)
    with pytest.raises(UserError, match="no 'visual.conv1.weight'; not an open_clip CLIP state dict"):
        convert_hps(_save(tmp_path / "d.pt", {"weight": torch.zeros(2)}), tmp_path / "d", tokenizer_dir, **HEADS)
    assert not any((tmp_path / name).exists() for name in "abcd")  # nothing half-written


def test_convert_refuses_code_bad_options_and_occupied_folders(tmp_path, source, tokenizer_dir, capsys):
    torch.save({"state_dict": {"visual.proj": _Payload()}}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="not a weights-only checkpoint"):
        convert_hps(tmp_path / "evil.pt", tmp_path / "evil", tokenizer_dir, **HEADS)
    assert "this must never run" not in capsys.readouterr().out
    with pytest.raises(UserError, match="--vision-heads 5: the vision width 16 does not split into 5 heads"):
        convert_hps(source, tmp_path / "h", tokenizer_dir, vision_heads=5, text_heads=3)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UserError, match="--out .*exists and is not an empty folder"):
        convert_hps(source, tmp_path / "full", tokenizer_dir, **HEADS)
    with pytest.raises(UserError, match="file not found"):
        convert_hps(tmp_path / "nope.pt", tmp_path / "n", tokenizer_dir, **HEADS)
    with pytest.raises(UserError, match="--out .*not a usable path .*File name too long"):
        convert_hps(source, tmp_path / ("x" * 300), tokenizer_dir, **HEADS)
    with pytest.raises(UserError, match="SOURCE .*not a usable path .*surrogates not allowed"):
        convert_hps(tmp_path / "\udcff.pt", tmp_path / "n", tokenizer_dir, **HEADS)
    with pytest.raises(UserError, match="--tokenizer-from .*folder not found"):
        convert_hps(source, tmp_path / "n", tmp_path / "no_tok", **HEADS)
    # a tokenizer whose <|endoftext|> is id 1: open_clip's argmax pooling would miss it
    with pytest.raises(UserError, match="end-of-text token id 1 is not the largest id"):
        convert_hps(source, tmp_path / "n", tiny_clip_folder(tmp_path / "eot_first"), **HEADS)


# ------------------------------------------------------------------------------ the command and the service
def test_convert_command_then_served_for_images_and_clips(tmp_path, source, tokenizer_dir):
    folder = tmp_path / "hps"
    result = CliRunner().invoke(app, ["reward", "convert-hps", str(source), "--out", str(folder), "--tokenizer-from", str(tokenizer_dir),
                                      "--vision-heads", "2", "--text-heads", "3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "--model hps=" in result.output
    direct = ClipRewardModel("hps", folder)
    proc = subprocess.Popen([sys.executable, "-m", "cosmos_rl.cli", "reward", "serve", "--port", "0", "--revision", "h-1",
                             "--model", f"hps={folder}"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        url = line.split("listening on ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        images = np.random.default_rng(5).integers(0, 256, (2, 20, 36, 3), dtype=np.uint8)
        client = RewardClient(url, "hps", "h-1", 30, 0, 0.0, expected_reward_revision=direct.revision)
        assert client.check_revision(MediaSpec.image(20, 36))["revisions"]["hps"] == direct.revision
        assert client.score(images, PROMPTS[:2]) == pytest.approx(direct(images, PROMPTS[:2]), abs=1e-6)
        # a clip is scored as pickscore's are: frames 0, 2, 4 sent as images, their scores' mean
        clips = np.random.default_rng(6).integers(0, 256, (2, 5, 20, 36, 3), dtype=np.uint8)
        frames = RewardClient(url, "hps", "h-1", 30, 0, 0.0, frame_reduce="mean", frame_stride=2)
        frames.check_revision(MediaSpec(5, 20, 36))
        expected = [np.mean(direct(clip[[0, 2, 4]], [p] * 3)) for clip, p in zip(clips, PROMPTS)]
        assert frames.score(clips, PROMPTS[:2]) == pytest.approx(expected, abs=1e-6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_convert_command_fails_in_one_line(tmp_path, tokenizer_dir):
    result = CliRunner().invoke(app, ["reward", "convert-hps", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "o"),
                                      "--tokenizer-from", str(tokenizer_dir)])  # fmt: skip
    assert result.exit_code != 0
    assert "missing.pt" in result.output and "file not found" in result.output


def test_eval_and_pairs_take_hps_as_a_folder_reward(hps_dir):
    from cosmos_rl.evaluation.served import served_terms

    (term,) = served_terms([f"hps={hps_dir}"])
    assert (term.name, term.model) == ("hps", str(hps_dir.resolve()))
    with pytest.raises(UserError, match="^--reward hps: a model reward needs its weights; pass --reward hps=FOLDER"):
        served_terms(["hps"])
