"""Presets, the offline tokenizer, and saving/loading model folders."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _models_helpers import NANO_HEADS, nano_folder, stock_pipeline

from cosmos_rl.core.errors import UserError
from cosmos_rl.models.build import (
    EXTRA_HEAD_PREFIXES,
    PRESETS,
    build_preset,
    load_parts,
    save_parts,
)
from cosmos_rl.models.tokenizer import SPECIAL_TOKENS, build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]


def _digest(parts) -> str:
    digest = hashlib.sha256()
    for module in (parts.transformer, parts.vae):
        for name, tensor in module.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tokenizer_has_every_byte_and_the_special_tokens():
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) == 256 + len(SPECIAL_TOKENS)
    text = "A café — 32x32, déjà vu!"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    for token in SPECIAL_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) >= 256
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")


def test_tiny_config_fits_together():
    parts = build_preset("tiny", seed=0)
    config = parts.transformer.config
    assert config.vocab_size >= len(parts.tokenizer)
    assert config.latent_channel == parts.vae.config.z_dim
    assert config.patch_latent_dim == config.latent_channel * config.latent_patch_size**2
    assert sum(config.rope_axes_dim) == config.head_dim // 2
    assert sum(p.numel() for p in parts.transformer.parameters()) < 1_000_000
    scheduler = parts.scheduler.config
    assert scheduler.prediction_type == "flow_prediction" and scheduler.use_flow_sigmas


def test_the_stock_pipeline_accepts_the_tiny_parts_and_makes_a_32px_image():
    parts = build_preset("tiny", seed=0)
    image = stock_pipeline(parts)(
        prompt="a red cube", num_frames=1, height=32, width=32, num_inference_steps=2,
        guidance_scale=2.0, output_type="pt", generator=torch.Generator().manual_seed(0),
    ).video  # fmt: skip
    assert image.shape == (1, 3, 32, 32)
    assert torch.isfinite(image).all()


def test_same_seed_same_weights_different_seed_different_weights():
    assert _digest(build_preset("tiny", seed=3)) == _digest(build_preset("tiny", seed=3))
    assert _digest(build_preset("tiny", seed=3)) != _digest(build_preset("tiny", seed=4))


def test_same_seed_same_weights_in_another_process():
    script = (
        "import sys; sys.path.insert(0, 'tests');"
        "from test_models_build import _digest; from cosmos_rl.models.build import build_preset;"
        "print(_digest(build_preset('tiny', seed=3)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip().splitlines()[-1] == _digest(build_preset("tiny", seed=3))


def test_building_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_preset("tiny", seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_preset_names_the_key_and_the_known_presets():
    with pytest.raises(UserError) as error:
        build_preset("huge", seed=0)
    message = str(error.value)
    assert "model.preset" in message and "'huge'" in message
    assert all(name in message for name in PRESETS)


def test_extra_heads_add_only_sound_and_action_keys():
    plain = build_preset("tiny", seed=0)
    nano = build_preset("tiny", seed=0, with_extra_heads=True)
    plain_state, nano_state = plain.transformer.state_dict(), nano.transformer.state_dict()
    extra = set(nano_state) - set(plain_state)
    assert set(plain_state) <= set(nano_state)
    assert extra and all(key.startswith(EXTRA_HEAD_PREFIXES) for key in extra)
    assert {p for p in EXTRA_HEAD_PREFIXES if any(k.startswith(p) for k in extra)} == set(EXTRA_HEAD_PREFIXES)
    # Shared weights are identical, so loading the base checkpoint minus its extra heads is exact.
    assert all(torch.equal(plain_state[k], nano_state[k]) for k in plain_state)
    assert _same_weights(plain.vae, nano.vae)


def test_save_then_load_round_trips_every_part(tmp_path):
    parts = build_preset("tiny", seed=5)
    save_parts(parts, tmp_path / "model")
    loaded = load_parts(tmp_path / "model")
    assert _same_weights(loaded.transformer, parts.transformer)
    assert _same_weights(loaded.vae, parts.vae)
    assert loaded.tokenizer("a cat")["input_ids"] == parts.tokenizer("a cat")["input_ids"]
    assert loaded.tokenizer.chat_template == parts.tokenizer.chat_template
    public = lambda config: {k: v for k, v in config.items() if not k.startswith("_")}  # noqa: E731
    assert public(loaded.scheduler.config) == public(parts.scheduler.config)


def test_loads_a_folder_written_by_the_diffusers_pipeline(tmp_path):
    parts = build_preset("tiny", seed=5)
    stock_pipeline(parts).save_pretrained(tmp_path / "pipe")
    loaded = load_parts(tmp_path / "pipe")
    assert _same_weights(loaded.transformer, parts.transformer)
    assert loaded.tokenizer("a dog")["input_ids"] == parts.tokenizer("a dog")["input_ids"]


def test_missing_folder_names_model_path(tmp_path):
    with pytest.raises(UserError, match="model.path") as error:
        load_parts(tmp_path / "nowhere")
    assert "nowhere" in str(error.value)


def test_missing_component_names_the_component(tmp_path):
    save_parts(build_preset("tiny", seed=0), tmp_path / "model")
    for path in (tmp_path / "model" / "vae").iterdir():
        path.unlink()
    (tmp_path / "model" / "vae").rmdir()
    with pytest.raises(UserError, match="model.path") as error:
        load_parts(tmp_path / "model")
    assert "vae/" in str(error.value)


def test_pickled_weights_are_refused_not_loaded(tmp_path):
    """A folder whose VAE is a pickled `.bin` (diffusers' unsafe format) is refused by name."""
    parts = build_preset("tiny", seed=0)
    folder = save_parts(parts, tmp_path / "model")
    for f in (folder / "vae").glob("*.safetensors"):
        f.unlink()
    parts.vae.save_pretrained(folder / "vae", safe_serialization=False)
    assert any((folder / "vae").glob("*.bin"))
    with pytest.raises(UserError, match=r"vae.*no \*\.safetensors.*pickled \['diffusion_pytorch_model\.bin'\]"):
        load_parts(folder)


# ------------------------------------------------------------------ a Cosmos3-Nano-layout folder


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return nano_folder(tmp_path_factory.mktemp("nano") / "pipe", seed=3, solver_order=3, flow_shift=3.0)


def test_a_nano_folder_builds_a_t2i_model_without_the_heads(nano):
    parts = load_parts(nano, skip_keys=NANO_HEADS)
    # Without a list, the library drops exactly the heads the folder's config declares.
    assert torch.equal(load_parts(nano).transformer.proj_in.weight, parts.transformer.proj_in.weight)
    keys = set(parts.transformer.state_dict())
    assert not any(key.startswith(EXTRA_HEAD_PREFIXES) for key in keys)
    assert not parts.transformer.config.sound_gen and not parts.transformer.config.action_gen
    nano_state = build_preset("tiny", seed=3, with_extra_heads=True).transformer.state_dict()
    assert all(torch.equal(tensor, nano_state[key]) for key, tensor in parts.transformer.state_dict().items())
    # The folder's own scheduler, not a default one.
    assert (parts.scheduler.config.solver_order, parts.scheduler.config.flow_shift) == (3, 3.0)
    assert parts.native_flow_schedule is False


def test_a_nano_folder_without_the_skip_list_names_the_head_keys(nano):
    with pytest.raises(UserError) as error:
        load_parts(nano, skip_keys=[])  # what a manifest with an empty rl.init_keys_to_skip_loading asks
    message = str(error.value)
    assert message.startswith("model.path: base checkpoint")
    assert "10 key(s) in the base that the model does not build: action_modality_embed" in message
    assert "rl.init_keys_to_skip_loading" in message


def _edit_json(path: Path, **changes) -> None:
    import json

    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_folder_settings_the_run_cannot_reproduce_are_refused(tmp_path):
    folder = nano_folder(tmp_path / "pipe")
    _edit_json(folder / "model_index.json", default_use_system_prompt=False)
    with pytest.raises(UserError, match=r"model.path: .*model_index.json sets default_use_system_prompt = false"):
        load_parts(folder, skip_keys=NANO_HEADS)
    _edit_json(folder / "model_index.json", default_use_system_prompt=True)
    _edit_json(folder / "scheduler" / "scheduler_config.json", _class_name="DDIMScheduler")
    with pytest.raises(UserError, match=r"scheduler_config.json is a DDIMScheduler, not a UniPCMultistepScheduler"):
        load_parts(folder, skip_keys=NANO_HEADS)
    _edit_json(folder / "scheduler" / "scheduler_config.json", _class_name="UniPCMultistepScheduler", num_train_timesteps=500)
    with pytest.raises(UserError, match=r"num_train_timesteps \(500\) is not 1 / the transformer's timestep_scale"):
        load_parts(folder, skip_keys=NANO_HEADS)
