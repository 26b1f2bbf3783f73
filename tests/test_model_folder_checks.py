"""Hostile model folders: each is refused in one line naming the file and key, before anything the
folder's config asks for is allocated (Cosmos3 pipeline folders and CLIP reward folders), and an
index never opens a file outside its folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from _models_helpers import NANO_HEADS, nano_folder
from _reward_models import tiny_clip_folder
from diffusers import Cosmos3OmniTransformer

from cosmos_rl import cli
from cosmos_rl.checkpoint.weight_files import FolderProblem, index_files, read_safetensors_header
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.build import load_parts
from cosmos_rl.rewards.models import ClipRewardModel

TRANSFORMER_WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return nano_folder(tmp_path_factory.mktemp("nano") / "pipe")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return tiny_clip_folder(tmp_path_factory.mktemp("clip") / "clip")


def _edit(path: Path, section: str | None = None, **changes) -> None:
    data = json.loads(path.read_text())
    (data[section] if section else data).update(changes)
    path.write_text(json.dumps(data))


def _claim_header(path: Path, length: int) -> None:
    """Rewrite the first 8 bytes of a safetensors file: the header's claimed length."""
    path.write_bytes(struct.pack("<Q", length) + path.read_bytes()[8:])


def _one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message
    return message


# ------------------------------------------------------------------------ Cosmos3 pipeline folders
# (name, how the folder is broken, the file and key the message must name)
NANO_CASES = [
    ("huge transformer", lambda d: _edit(d / "transformer/config.json", hidden_size=16384, num_hidden_layers=48),
     r"transformer/config.json': builds .* as \(261, 16384\), but the weights in .* hold \(261, 64\)"),
    ("negative dim", lambda d: _edit(d / "transformer/config.json", hidden_size=-4),
     r"transformer/config.json': hidden_size is -4; it must be an integer at least 1"),
    ("string dim", lambda d: _edit(d / "transformer/config.json", num_attention_heads="4"),
     r"transformer/config.json': num_attention_heads is \"4\"; it must be an integer"),
    ("vocab 2e9", lambda d: _edit(d / "transformer/config.json", vocab_size=2e9),
     r"transformer/config.json': vocab_size is 2000000000.0; it must be an integer"),
    ("timestep_scale 0", lambda d: _edit(d / "transformer/config.json", timestep_scale=0),
     r"transformer/config.json': timestep_scale is 0; it must be a finite number above 0"),
    ("bad JSON", lambda d: (d / "transformer/config.json").write_text('{"hidden_size": 64,'),
     r"transformer/config.json': config.json is not valid JSON"),
    ("deep JSON", lambda d: (d / "transformer/config.json").write_text("[" * 100_000 + "]" * 100_000),
     r"transformer/config.json': config.json is not valid JSON \(nested too deeply\)"),
    ("vae shape mismatch", lambda d: _edit(d / "vae/config.json", z_dim=8),
     r"vae/config.json': builds .* but the weights in .*vae' hold"),
    ("vae string list", lambda d: _edit(d / "vae/config.json", dim_mult="11"),
     r"vae/config.json': dim_mult is \"11\"; it must be a list of integers"),
    ("header 2^62", lambda d: _claim_header(d / TRANSFORMER_WEIGHTS, 2**62),
     r"diffusion_pytorch_model.safetensors': the safetensors header claims 4611686018427387904 bytes"),
    ("bad index", lambda d: (d / "transformer/diffusion_pytorch_model.safetensors.index.json").write_text('{"weight_map": []}'),
     r"safetensors.index.json': weight_map is not an object"),
    ("missing tokenizer", lambda d: (d / "text_tokenizer/tokenizer.json").unlink(),
     r"text_tokenizer' has no tokenizer.json"),
    ("vocab below the tokenizer", lambda d: _edit(d / "transformer/config.json", vocab_size=100),
     r"transformer/config.json': builds embed_tokens.weight as \(100, 64\)"),
    ("scheduler array bomb", lambda d: _edit(d / "scheduler/scheduler_config.json", num_train_timesteps=10**12),
     r"scheduler_config.json': num_train_timesteps is 1000000000000; it must be an integer"),
]


@pytest.mark.parametrize("name, breaks, expected", NANO_CASES, ids=[c[0] for c in NANO_CASES])
def test_a_hostile_pipeline_folder_is_refused_in_one_line_before_anything_is_built(nano, tmp_path, monkeypatch, name, breaks, expected):
    folder = shutil.copytree(nano, tmp_path / "pipe")
    breaks(folder)
    devices = []  # where every transformer build happened
    original = Cosmos3OmniTransformer.from_config.__func__

    def recording(cls, *args, **kwargs):
        devices.append(torch.get_default_device().type)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Cosmos3OmniTransformer, "from_config", classmethod(recording))
    with pytest.raises(UserError) as error:
        load_parts(folder, skip_keys=NANO_HEADS)
    message = _one_line(str(error.value))
    assert message.startswith("model.path: ")
    assert re.search(expected, message), message
    assert set(devices) <= {"meta"}, f"a transformer was built on {devices} before the folder was refused"


def test_the_untouched_folder_and_a_sharded_one_still_load(nano, tmp_path):
    parts = load_parts(nano, skip_keys=NANO_HEADS)
    folder = shutil.copytree(nano, tmp_path / "sharded")
    (folder / TRANSFORMER_WEIGHTS).unlink()
    full = Cosmos3OmniTransformer.from_config(json.loads((nano / "transformer/config.json").read_text()))
    full.load_state_dict(read_back(nano / TRANSFORMER_WEIGHTS))
    full.save_pretrained(folder / "transformer", max_shard_size="200KB")
    assert len(list((folder / "transformer").glob("*.safetensors"))) > 1
    assert (folder / "transformer/diffusion_pytorch_model.safetensors.index.json").is_file()
    sharded = load_parts(folder, skip_keys=NANO_HEADS)
    assert all(torch.equal(a, b) for a, b in zip(parts.transformer.state_dict().values(), sharded.transformer.state_dict().values()))


def read_back(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_eval_of_a_hostile_folder_exits_2_with_one_line(nano, tmp_path, capsys):
    folder = shutil.copytree(nano, tmp_path / "pipe")
    _edit(folder / "transformer/config.json", hidden_size=16384, num_hidden_layers=48)
    with pytest.raises(SystemExit) as info:
        cli.app(["eval", str(folder), "--suite", "shapes", "--out", str(tmp_path / "eval"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "transformer/config.json" in err and "builds embed_tokens.weight as (261, 16384)" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------ an index names files in its folder
def _index(folder: Path, name: str) -> Path:
    index = folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"proj_in.weight": name}}))
    return index


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "../vae/diffusion_pytorch_model.safetensors", "link.safetensors"])
def test_an_index_naming_a_file_outside_its_folder_is_refused_by_name(nano, tmp_path, monkeypatch, name):
    folder = shutil.copytree(nano, tmp_path / "pipe")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(nano / TRANSFORMER_WEIGHTS, outside)
    os.symlink(outside, folder / "transformer" / "link.safetensors")  # inside by name, outside once resolved
    index = _index(folder, name)
    opened = []
    real_open = open

    def watching(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watching)
    with pytest.raises(FolderProblem, match=rf"weight_map names {re.escape(repr(name))}, which is outside the folder"):
        index_files(folder / "transformer", index)
    monkeypatch.undo()
    assert not any("passwd" in p or "outside" in p for p in opened)
    with pytest.raises(UserError, match=r"^model.path: .*index.json': weight_map names .* outside the folder"):
        load_parts(folder, skip_keys=NANO_HEADS)


# ------------------------------------------------------------------------ safetensors headers, read alone
def _tiny_safetensors(path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2, 3)}, str(path))
    return path


def _rewrite_header(path: Path, header: dict) -> None:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + length:])


@pytest.mark.parametrize(
    "entry, expected",
    [
        ({"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}, "not a list of non-negative integers"),
        ({"dtype": "F32", "shape": [2, "3"], "data_offsets": [0, 24]}, "not a list of non-negative integers"),
        ({"dtype": "F99", "shape": [2, 3], "data_offsets": [0, 24]}, "unknown dtype 'F99'"),
        ({"dtype": "F32", "shape": [2**40, 2**20], "data_offsets": [0, 24]}, "has 24 bytes for shape"),
        ({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 2**62]}, "outside the file's 24 data bytes"),
    ],
)
def test_a_header_cannot_claim_more_than_its_file_holds(tmp_path, entry, expected):
    path = _tiny_safetensors(tmp_path / "w.safetensors")
    assert read_safetensors_header(path) == {"w": ("F32", (2, 3))}
    _rewrite_header(path, {"w": entry})
    with pytest.raises(FolderProblem, match=expected):
        read_safetensors_header(path)


def test_a_header_longer_than_its_file_and_a_pipe_are_refused_without_reading(tmp_path):
    path = _tiny_safetensors(tmp_path / "w.safetensors")
    _claim_header(path, path.stat().st_size)  # one claimed byte more than the file holds after the length
    with pytest.raises(FolderProblem, match=r"header claims \d+ bytes \(the file has \d+"):
        read_safetensors_header(path)
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)  # opening a FIFO for reading would block until a writer comes
    with pytest.raises(FolderProblem, match="is not a regular file"):
        read_safetensors_header(fifo)


# ------------------------------------------------------------------------ CLIP reward folders
CLIP_CASES = [
    ("huge vision", lambda d: _edit(d / "config.json", "vision_config", hidden_size=16384, num_hidden_layers=48),
     r"config.json': builds vision_model.* as \(16384,?.*\), but the weights in .* hold"),
    ("negative text dim", lambda d: _edit(d / "config.json", "text_config", hidden_size=-1),
     r"config.json': text_config.hidden_size is -1; it must be an integer"),
    ("string vocab", lambda d: _edit(d / "config.json", "text_config", vocab_size="many"),
     r"config.json': text_config.vocab_size is \"many\""),
    ("projection mismatch", lambda d: _edit(d / "config.json", projection_dim=64),
     r"config.json': builds .*projection.weight as \(64, 16\), but the weights"),
    ("bad JSON", lambda d: (d / "config.json").write_text("[1,"), r"config.json': config.json is not valid JSON"),
    ("huge crop", lambda d: _edit(d / "processor_config.json", "image_processor", crop_size={"height": 100000, "width": 100000}),
     r"processor_config.json': image processor crop_size is \{'height': 100000, 'width': 100000\}; the model takes 32x32"),
    ("huge crop, older layout", lambda d: (d / "preprocessor_config.json").write_text(json.dumps(
        {**json.loads((d / "processor_config.json").read_text())["image_processor"], "crop_size": 100000})),
     r"preprocessor_config.json': image processor crop_size is 100000; the model takes 32x32"),
    ("huge resize", lambda d: _edit(d / "processor_config.json", "image_processor", size={"shortest_edge": 100000}),
     r"processor_config.json': image processor size is \{'shortest_edge': 100000\}, outside 1 to 128"),
    ("no crop, other size", lambda d: _edit(d / "processor_config.json", "image_processor", do_center_crop=False),
     r"image processor neither crops nor resizes to \{height: 32, width: 32\}"),
    ("zero std", lambda d: _edit(d / "processor_config.json", "image_processor", image_std=[0, 1, 1]),
     r"image processor image_std is \[0, 1, 1\]; it must be 3 numbers, above 0"),
    ("header 2^62", lambda d: _claim_header(d / "model.safetensors", 2**62), r"model.safetensors': the safetensors header claims"),
    ("index escape", lambda d: (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}})),
     r"index.json': weight_map names '../../etc/passwd', which is outside the folder"),
    ("no tokenizer", lambda d: (d / "tokenizer.json").unlink(), r"no tokenizer \(tokenizer.json"),
]


@pytest.mark.parametrize("name, breaks, expected", CLIP_CASES, ids=[c[0] for c in CLIP_CASES])
def test_a_hostile_clip_folder_is_refused_in_one_line(clip, tmp_path, name, breaks, expected):
    folder = shutil.copytree(clip, tmp_path / "clip")
    breaks(folder)
    with pytest.raises(UserError) as error:
        ClipRewardModel("clipscore", folder, device="cpu")
    message = _one_line(str(error.value))
    assert message.startswith(f"--model clipscore={folder.resolve()}: ")
    assert re.search(expected, message), message


def test_reward_serve_on_a_broken_clip_folder_exits_2_before_listening(clip, tmp_path, capsys):
    folder = shutil.copytree(clip, tmp_path / "clip")
    _edit(folder / "processor_config.json", "image_processor", crop_size={"height": 100000, "width": 100000})
    with pytest.raises(SystemExit) as info:
        cli.app(["reward", "serve", "--revision", "r1", "--port", "0", "--model", f"clipscore={folder}"])
    captured = capsys.readouterr()
    assert info.value.code == 2
    assert "crop_size" in captured.err and "Traceback" not in captured.err
    assert "listening" not in captured.out


# ------------------------------------------------------------------------ eval judges a folder as validate does
def _eval_refusal(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.app(["eval", *args, "--seeds", "1", "--per-task", "1", "--device", "cpu"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err, err
    return " ".join(err.split())


def test_eval_at_a_size_the_vae_cannot_divide_is_refused_before_loading(nano, tmp_path, capsys):
    err = _eval_refusal(capsys, str(nano), "--suite", "shapes", "--image-size", "30", "--out", str(tmp_path / "e"))
    assert "--image-size: must be a multiple of the VAE's 4-pixel latent cell" in err and "(got 30)" in err
    err = _eval_refusal(capsys, "preset:tiny", "--suite", "shapes", "--image-size", "30", "--out", str(tmp_path / "e"))
    assert "--image-size: 30 is not a multiple of preset:tiny's 4-pixel latent cell" in err


def test_eval_of_clips_refuses_a_vae_config_lying_about_its_temporal_factor(nano, tmp_path, capsys):
    folder = shutil.copytree(nano, tmp_path / "pipe")
    _edit(folder / "vae/config.json", scale_factor_temporal=4)  # its stages compress time 1x
    err = _eval_refusal(capsys, str(folder), "--suite", "shapes_video", "--frames", "5", "--out", str(tmp_path / "e"))
    assert f"TARGET '{folder}': vae/config.json declares scale_factor_temporal = 4" in err and "set scale_factor_temporal = 1" in err


def test_eval_refuses_a_folder_config_past_its_bounds_before_loading(nano, tmp_path, capsys):
    folder = shutil.copytree(nano, tmp_path / "pipe")
    _edit(folder / "vae/config.json", scale_factor_temporal=10**6)
    err = _eval_refusal(capsys, str(folder), "--suite", "shapes", "--out", str(tmp_path / "e"))
    assert f"TARGET '{folder}':" in err and "scale_factor_temporal" in err


def test_a_deeply_nested_cosmos_rl_json_is_one_line(nano, tmp_path):
    from cosmos_rl.models.build import read_prompt_template

    folder = shutil.copytree(nano, tmp_path / "pipe")
    (folder / "cosmos_rl.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match=r"^model.path: cosmos_rl.json .* is JSON nested too deeply to read; fix or regenerate it$"):
        read_prompt_template(folder)
