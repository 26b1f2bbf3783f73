"""`setup.load_base`: the model a manifest names, with the base weights it names, from a
Cosmos3-Nano-layout folder (heads included) built with diffusers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from _models_helpers import NANO_HEADS, nano_folder

from cosmos_rl.checkpoint.collective import quiet_single_process
from cosmos_rl.config import load
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.build import EXTRA_HEAD_PREFIXES, build_preset
from cosmos_rl.models.setup import load_base


def config(tmp_path, model: dict, **rl):
    raw = {
        "job": {"output_dir": str(tmp_path / "runs"), "seed": 0},
        "model": model,
        "rl": {"algorithm": "dpo", "data": {"synthetic_pairs": 4}, **rl},
    }
    return load.structure(raw)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return nano_folder(tmp_path_factory.mktemp("nano") / "pipe", seed=4, solver_order=3, flow_shift=2.0)


def _nano_state():
    return build_preset("tiny", seed=4, with_extra_heads=True).transformer.state_dict()


@pytest.mark.parametrize("init_from", ["", "folder"])
def test_a_folder_model_loads_its_own_weights_without_building_the_heads(tmp_path, nano, init_from):
    parts = load_base(config(
        tmp_path, {"path": str(nano)}, init_from=str(nano) if init_from else "", init_keys_to_skip_loading=NANO_HEADS,
    ))  # fmt: skip
    state = parts.transformer.state_dict()
    assert not any(key.startswith(EXTRA_HEAD_PREFIXES) for key in state)
    nano_state = _nano_state()
    assert all(torch.equal(tensor, nano_state[key]) for key, tensor in state.items())
    assert (parts.scheduler.config.solver_order, parts.scheduler.config.flow_shift) == (3, 2.0)


def test_a_dcp_base_goes_into_the_folder_architecture(tmp_path, nano):
    other = build_preset("tiny", seed=9, with_extra_heads=True).transformer.state_dict()
    with quiet_single_process():
        dcp.save(other, checkpoint_id=str(tmp_path / "dcp"))
    parts = load_base(config(tmp_path, {"path": str(nano)}, init_from=str(tmp_path / "dcp"), init_keys_to_skip_loading=NANO_HEADS))
    assert all(torch.equal(tensor, other[key]) for key, tensor in parts.transformer.state_dict().items())


def test_the_preset_model_ignores_nothing_and_loads_nothing(tmp_path):
    parts = load_base(config(tmp_path, {"preset": "tiny"}))
    expected = build_preset("tiny", seed=0).transformer.state_dict()
    assert all(torch.equal(tensor, expected[key]) for key, tensor in parts.transformer.state_dict().items())


def test_a_pipeline_folder_from_s3_is_refused_for_a_preset_model(tmp_path, nano, monkeypatch):
    # Preflight cannot see inside an s3:// base; the pulled copy is checked before anything loads.
    import shutil

    from cosmos_rl.models import setup
    from cosmos_rl.models.layout import s3_cache_dir

    cfg = config(tmp_path, {"preset": "tiny"}, init_from="s3://bases/nano")
    cached = s3_cache_dir("s3://bases/nano", setup._init_cache_dir(cfg))
    shutil.copytree(nano, cached)  # as if pulled
    with pytest.raises(UserError) as error:
        load_base(cfg)
    message = str(error.value)
    assert message.startswith("rl.init_from: s3://bases/nano is a whole diffusers pipeline folder")
    assert "model.preset" in message and str(cached) not in message


@pytest.mark.parametrize("init_from", ["", "folder", "dcp"])
def test_video_nft_builds_every_head_and_loads_the_whole_base(tmp_path, nano, init_from):
    """Video NFT's rl.init_keys_to_skip_loading is empty (the spec's video contract), so its model is
    built with the folder's sound and action heads and every base key loads, heads included; the
    same folder on an image NFT run builds without them (and the empty list then fails the load)."""
    state = _nano_state()
    if init_from == "dcp":
        with quiet_single_process():
            dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    base = {"": str(nano), "folder": str(nano), "dcp": str(tmp_path / "dcp")}[init_from]
    nft = {"algorithm": "nft", "init_from": base, "reward": {"name": "brightness", "revision": "builtin-v1"}}

    def structured(frames: int, **rl):
        raw = {"job": {"output_dir": str(tmp_path / "runs")}, "model": {"path": str(nano), "num_frames": frames},
               "rl": {**nft, "modality": "video" if frames > 1 else "image", **rl}}  # fmt: skip
        return load.structure(raw)

    built = load_base(structured(5)).transformer
    assert built.config.sound_gen and built.config.action_gen
    loaded = built.state_dict()
    assert set(loaded) == set(state) and any(key.startswith(EXTRA_HEAD_PREFIXES) for key in loaded)
    assert all(torch.equal(tensor, state[key]) for key, tensor in loaded.items())
    with pytest.raises(UserError, match="key\\(s\\) in the base that the model does not build: action_"):
        load_base(structured(1, profile="t2i_tiny"))
