"""The `pusht` preset (`models.pusht_preset`): a tiny Push-T base built by the build command loads
as `model.preset = "pusht"` with its action heads and the built weights (float16 round trip), a
forward-dynamics manifest on it validates and plans without loading it, and a file whose sha256
differs from manifest.json (or a missing folder) is refused with the rebuild command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cosmos_rl.commands import pusht_base_build as pb
from cosmos_rl.config import load, preflight
from cosmos_rl.core.errors import UserError
from cosmos_rl.models import pusht_preset
from cosmos_rl.models.build import build_preset, load_parts

REPO = Path(__file__).resolve().parents[1]
NFT_WORLD = REPO / "manifests" / "nft_pusht_dynamics_cpu.toml"
TINY = ["--samples", "2", "--episode-frames", "10", "--vae-steps", "1", "--vae-batch", "2", "--steps", "1", "--batch", "2",
        "--held-out-episodes", "2", "--checkpoint-every", "1"]  # fmt: skip
KEYS = ["pusht window seed=7 task=planner episode=0 start=0 length=10", "pusht window seed=7 task=random episode=1 start=1 length=10"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """(the build's --out, its --work): a one-step base past a gate set to 0 (the plumbing, not the figures)."""
    root = tmp_path_factory.mktemp("pusht_preset")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pb, "VAE_GATE", 0.0)
        assert pb.main(["build", "--work", str(root / "work"), "--out", str(root / "out"), *TINY]) == 0
    return root


def test_the_preset_loads_the_built_files_with_action_heads(built, monkeypatch):
    monkeypatch.setattr(pusht_preset, "WEIGHTS_DIR", built / "out")
    parts = build_preset("pusht", seed=5)
    config = parts.transformer.config
    assert (config.action_gen, config.action_dim, config.num_embodiment_domains, config.latent_patch_size) == (True, 2, 21, 4)
    assert parts.vae.config.scale_factor_temporal == 1 and parts.vae.config.scale_factor_spatial == 2
    assert parts.prompt_template == "minimal"
    trained = load_parts(built / "work" / "model", heads=True)
    assert any(k.startswith("action_proj_in") for k in parts.transformer.state_dict())
    for ours, theirs in ((parts.transformer, trained.transformer), (parts.vae, trained.vae)):
        mine, built_state = ours.state_dict(), theirs.state_dict()
        assert set(mine) == set(built_state)
        assert all(torch.equal(v, built_state[k].half().float()) for k, v in mine.items())
    assert list(parts.vae.config.latents_mean) == list(trained.vae.config.latents_mean)
    with pytest.raises(ValueError, match="no sound heads"):
        build_preset("pusht", seed=0, with_extra_heads=True)


def test_a_changed_file_and_a_missing_folder_are_refused_with_the_rebuild_command(built, tmp_path, monkeypatch):
    copy = shutil.copytree(built / "out", tmp_path / "out")
    data = bytearray((copy / "vae.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "vae.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(pusht_preset, "WEIGHTS_DIR", copy)
    with pytest.raises(UserError, match="vae.safetensors is its sha256 differs from manifest.json; rebuild it with `python -m cosmos_rl.commands.pusht_base_build build`"):
        build_preset("pusht", seed=0)
    # A base built at another latent patch is named as such.
    manifest = json.loads((built / "out" / "manifest.json").read_text())
    manifest["recipe"]["patch"] = 2
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="built at --patch 2, and the pusht preset's transformer has latent patch 4"):
        build_preset("pusht", seed=0)
    monkeypatch.setattr(pusht_preset, "WEIGHTS_DIR", tmp_path / "absent")
    with pytest.raises(UserError, match=r"the shipped base is missing .*manifest.json not found\); rebuild it with `python -m cosmos_rl.commands.pusht_base_build build`"):
        build_preset("pusht", seed=0)


def test_a_forward_dynamics_manifest_on_the_preset_validates_and_plans(tmp_path):
    from cosmos_rl.planning import plan

    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    overrides = ['model.path=""', 'model.preset="pusht"', 'rl.init_from="preset:pusht"', f'rl.prompts.file="{keys}"', f'job.output_dir="{tmp_path}"']
    config = load.load(NFT_WORLD, overrides)
    assert [p.render() for p in preflight.check(config, NFT_WORLD.parent) if p.severity == "error"] == []
    shown = plan.build(config, str(NFT_WORLD))
    assert "shipped pretrained weights of preset 'pusht'" in str(shown)
    # Its heads answer preflight's questions from the architecture alone: bridge's 7 columns do not fit its 2.
    wide = load.load(NFT_WORLD, [*overrides, 'model.action.embodiment="bridge_orig_lerobot"', "model.action.offset=[]", "model.action.scale=[]"])
    found = {p.path: p.render() for p in preflight.check(wide, NFT_WORLD.parent) if p.severity == "error"}
    assert "action_dim 2 is narrower than bridge_orig_lerobot's" in found["model.preset"]


def test_the_shipped_pusht_base_is_the_preset_with_action_heads_and_a_gated_vae():
    # The files in cosmos_rl/models/presets/pusht/ (the seed-0 build's --out): loaded by the preset,
    # their sha256 checked, the VAE gate passed, small enough to ship.
    from cosmos_rl.models.build import build_preset
    from cosmos_rl.models.pusht_preset import REBUILD, WEIGHTS_DIR
    from cosmos_rl.models.shapes_preset import read_manifest

    parts = build_preset("pusht", 0)
    config = parts.transformer.config
    assert config.action_gen and config.action_dim == 2 and config.num_embodiment_domains == 21 and config.latent_patch_size == 4
    manifest = read_manifest(WEIGHTS_DIR, REBUILD)
    assert manifest["preset"] == "pusht" and manifest["media"] == {"fps": 10.0, "frames": 9, "size": 32}
    assert manifest["recipe"]["patch"] == 4 and manifest["action"]["embodiment"] == "pusht"
    assert manifest["vae_gate"]["windows"] == 80 and manifest["vae_gate"]["strict"] >= manifest["vae_gate"]["threshold"] == 0.9
    assert all(info["bytes"] < 4 * 2**20 for info in manifest["files"].values())
    assert manifest["latents_std"] == list(parts.vae.config.latents_std)
