"""The VAE latent cache: exact values, hits in memory and on disk, keyed by content and VAE identity;
entries verified when read, a stable VAE identity, a full disk, clips."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from cosmos_rl.models import latent_cache as lc
from cosmos_rl.models import latent_entry
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.vae import encode_clips, encode_images

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vae():
    return build_preset("tiny", seed=0).vae


def _images(seed: int, n: int = 4) -> torch.Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_first_encode_is_the_plain_encode_and_repeats_are_served_from_memory(vae):
    cache = lc.LatentCache(vae, None)
    images = _images(0)
    first = cache.encode(images)
    assert torch.equal(first, encode_images(vae, images))
    again = cache.encode(images)
    assert torch.equal(again, first) and (cache.hits, cache.misses) == (4, 4)


def test_a_batch_with_one_new_image_is_encoded_whole(vae):
    cache = lc.LatentCache(vae, None)
    old, new = _images(0, 3), _images(1, 1)
    cache.encode(old)
    mixed = torch.cat([old, new])
    assert torch.equal(cache.encode(mixed), encode_images(vae, mixed))
    assert cache.misses == 4  # 3 then 1: the cached three were re-encoded with the new one, not stitched


def test_a_new_process_reads_the_disk_cache_without_the_vae(vae, tmp_path, monkeypatch):
    images = _images(2)
    expected = lc.LatentCache(vae, tmp_path).encode(images)
    fresh = lc.LatentCache(vae, tmp_path)
    monkeypatch.setattr(lc, "encode_pixels", lambda *a: pytest.fail("the VAE ran on cached images"))
    assert torch.equal(fresh.encode(images), expected) and fresh.hits == 4


def test_another_vae_or_another_image_is_a_miss(vae, tmp_path):
    images = _images(3)
    lc.LatentCache(vae, tmp_path).encode(images)
    other = build_preset("tiny", seed=1).vae
    assert lc.vae_identity(other) != lc.vae_identity(vae)
    cache = lc.LatentCache(other, tmp_path)
    assert torch.equal(cache.encode(images), encode_images(other, images)) and cache.misses == 4
    changed = images.clone()
    changed[0, 0, 0, 0] += 1e-3
    assert lc.input_key(changed[0]) != lc.input_key(images[0])


def test_a_damaged_entry_is_encoded_again_and_rewritten(vae, tmp_path):
    images = _images(4, 1)
    cache = lc.LatentCache(vae, tmp_path)
    expected = cache.encode(images)
    (entry,) = list(cache.folder.rglob("*.safetensors"))
    entry.write_bytes(b"not a safetensors file")
    again = lc.LatentCache(vae, tmp_path)
    assert torch.equal(again.encode(images), expected) and again.misses == 1
    assert torch.equal(lc.LatentCache(vae, tmp_path).encode(images), expected)  # rewritten whole


def test_dpo_with_the_disk_cache_trains_exactly_as_without_it(tmp_path):
    """Over more than one epoch of the pairs, so later steps are served from the cache."""
    from pathlib import Path

    from cosmos_rl.config import load
    from cosmos_rl.trainers.dpo import DPOTrainer

    smoke = Path(__file__).resolve().parents[1] / "manifests" / "dpo_t2i_smoke.toml"
    rows = {}
    for mode in ("off", "disk"):
        config = load.load(smoke, [f'job.output_dir="{tmp_path / mode}"', "rl.pairs_per_step=4", "rl.data.synthetic_pairs=8",
                                   "rl.validation.every=0", "rl.max_steps=5", f'rl.latent_cache="{mode}"', "job.progress=false"])
        trainer = DPOTrainer(config, tmp_path / mode / "run", torch.device("cpu"))
        rows[mode] = [{k: v for k, v in r.items() if k != "train/pairs_per_s"} for r in trainer.run()]
        if mode == "disk":
            assert trainer.latents.hits > 0
    assert rows["disk"] == rows["off"]


# ------------------------------------------------------------------------------ hostile entries
def _hostile(kind: str, good: bytes, latent: torch.Tensor, key: str, vae_id: str) -> bytes:
    """The file an attacker or a bad disk leaves where the entry for `key` belongs. All but the
    flipped byte, the truncated file and the old format carry a record consistent with the tensor
    they hold (shape, dtype and checksum of those bytes), so only the reader's own expectations
    catch them."""
    if kind == "wrong shape":
        return latent_entry.entry_bytes(latent[:, :, :4, :4].contiguous(), key, vae_id)
    if kind == "float16":
        return latent_entry.entry_bytes(latent.half(), key, vae_id)
    if kind == "float64":
        return latent_entry.entry_bytes(latent.double(), key, vae_id)
    if kind == "nan":
        poisoned = latent.clone()
        poisoned[0, 0, 0, 0] = float("nan")
        return latent_entry.entry_bytes(poisoned, key, vae_id)
    if kind == "another input's entry":
        return latent_entry.entry_bytes(latent + 1.0, "0" * 64, vae_id)
    if kind == "flipped byte":  # the last byte is in the tensor's data, past the header
        return good[:-1] + bytes([good[-1] ^ 0x01])
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "old format":  # what the cache wrote before entries carried a record
        return save({"latent": latent})
    raise AssertionError(kind)


HOSTILE = {
    "wrong shape": "holds latents of shape (4, 1, 4, 4); this input's latents are (4, 1, 8, 8)",
    "float16": "holds torch.float16 latents; this input's are torch.float32",
    "float64": "holds torch.float64 latents; this input's are torch.float32",
    "nan": "holds 1 non-finite values",
    "another input's entry": "was written for another input",
    "flipped byte": "do not match the checksum written with them",
    "truncated": "is not a readable safetensors file",
    "old format": "has no entry record",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_entry_is_encoded_again_rewritten_and_warned_once(vae, tmp_path, monkeypatch, caplog, kind):
    images = _images(5, 2)
    expected = encode_images(vae, images)  # the uncached numbers
    writer = lc.LatentCache(vae, tmp_path)
    writer.encode(images)
    key = lc.input_key(images[0])
    path = writer._path(key)
    path.write_bytes(_hostile(kind, path.read_bytes(), expected[0], key, writer.identity))

    reader = lc.LatentCache(vae, tmp_path)
    with caplog.at_level(logging.WARNING, logger="cosmos_rl.models.latent_cache"):
        assert torch.equal(reader.encode(images), expected)
        assert torch.equal(reader.encode(images), expected)  # later epochs: no second warning
    assert reader.misses == 1 and reader.hits == 2
    (record,) = caplog.records
    assert str(path) in record.getMessage() and HOSTILE[kind] in record.getMessage()

    # rewritten as a whole entry: it verifies, and a new process serves it without the VAE
    assert torch.equal(latent_entry.read_entry(path, key, writer.identity, (4, 1, 8, 8), torch.float32), expected[0])
    monkeypatch.setattr(lc, "encode_pixels", lambda *a: pytest.fail("the VAE ran on a rewritten entry"))
    fresh = lc.LatentCache(vae, tmp_path)
    assert torch.equal(fresh.encode(images), expected) and fresh.hits == 2


def test_a_non_finite_encode_is_never_cached(vae, tmp_path, monkeypatch):
    images = _images(6, 1)
    nan = torch.full((1, 4, 1, 8, 8), float("nan"))
    monkeypatch.setattr(lc, "encode_pixels", lambda *a: nan)
    cache = lc.LatentCache(vae, tmp_path)
    assert cache.encode(images).isnan().all() and cache.encode(images).isnan().all()
    assert cache.misses == 2 and not list(tmp_path.rglob("*.safetensors"))


# ------------------------------------------------------------------------------ the VAE identity
# A stand-in VAE whose config lists its defaults the way diffusers' `register_to_config` does,
# `list(set(kwargs) - set(init_kwargs))`, so the order follows PYTHONHASHSEED; torch only, so each
# process starts in about a second (diffusers' import takes several).
_IDENTITY_IN_A_NEW_PROCESS = """
import json, torch
from cosmos_rl.models.latent_keys import vae_identity
torch.manual_seed(0)
vae = torch.nn.Linear(3, 2)
given = {"base_dim": 8, "z_dim": 4}
defaults = list(set([*given, "dropout", "is_residual", "decoder_base_dim"]) - set(given))
vae.config = {**given, "dropout": 0.0, "is_residual": False, "decoder_base_dim": None, "_use_default_values": defaults}
print(json.dumps({"id": vae_identity(vae), "defaults": defaults}))
"""


def test_the_vae_identity_is_the_same_under_every_string_hash_seed():
    """The seeds below give `_use_default_values` different orders (checked, so the test exercises
    the hazard) and must give one id."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = [
        subprocess.Popen([sys.executable, "-c", _IDENTITY_IN_A_NEW_PROCESS], env={**env, "PYTHONHASHSEED": seed},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in ("0", "1")
    ]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({tuple(o["defaults"]) for o in outputs}) > 1, "these seeds no longer reorder the list: pick others"
    assert len({o["id"] for o in outputs}) == 1


def test_the_real_vae_identity_ignores_the_order_of_its_defaults_list():
    from diffusers.configuration_utils import FrozenDict

    vae = build_preset("tiny", seed=0).vae
    before = lc.vae_identity(vae)
    config = dict(vae.config)
    assert len(config["_use_default_values"]) > 1
    vae._internal_dict = FrozenDict({**config, "_use_default_values": config["_use_default_values"][::-1]})
    assert lc.vae_identity(vae) == before
    vae._internal_dict = FrozenDict({**config, "latents_mean": [0.0, 0.0, 0.0, 0.0]})
    assert lc.vae_identity(vae) != before  # a public key counts


def test_the_same_vae_loaded_from_a_folder_has_the_same_identity(vae, tmp_path):
    """A folder adds `_name_or_path`, `_class_name` and `_diffusers_version` to the config."""
    from diffusers import AutoencoderKLWan

    vae.save_pretrained(tmp_path / "vae")
    loaded = AutoencoderKLWan.from_pretrained(tmp_path / "vae")
    assert "_name_or_path" in dict(loaded.config)
    assert lc.vae_identity(loaded) == lc.vae_identity(vae)


# ------------------------------------------------------------------------------ a full disk
def test_a_full_disk_warns_once_and_the_cache_carries_on_in_memory(vae, tmp_path, monkeypatch, caplog):
    calls = []

    def full_disk(path, data):  # a real full disk: part of the file lands, then the write fails
        calls.append(path)
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lc, "_write_file", full_disk)
    first, second = _images(7, 2), _images(8, 2)
    cache = lc.LatentCache(vae, tmp_path)
    with caplog.at_level(logging.WARNING, logger="cosmos_rl.models.latent_cache"):
        assert torch.equal(cache.encode(first), encode_images(vae, first))
        assert torch.equal(cache.encode(second), encode_images(vae, second))
        assert torch.equal(cache.encode(first), encode_images(vae, first))
    assert cache.hits == 2 and cache.misses == 4  # served from memory after the disk failed
    (record,) = caplog.records
    assert os.strerror(errno.ENOSPC) in record.getMessage() and "carrying on" in record.getMessage()
    assert len(calls) == 1  # no write is tried again
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # the half-written file is gone


# ------------------------------------------------------------------------------ clips
def _clips(seed: int, n: int = 2, frames: int = 5) -> torch.Tensor:
    return torch.rand(n, 3, frames, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_clips_are_encoded_as_clips_and_served_from_disk(vae, tmp_path, monkeypatch):
    clips = _clips(9)
    expected = encode_clips(vae, clips)
    assert expected.shape == (2, 4, 5, 8, 8)
    assert torch.equal(lc.LatentCache(vae, tmp_path).encode(clips), expected)
    monkeypatch.setattr(lc, "encode_pixels", lambda *a: pytest.fail("the VAE ran on cached clips"))
    fresh = lc.LatentCache(vae, tmp_path)
    assert torch.equal(fresh.encode(clips), expected) and fresh.hits == 2
    assert fresh.latent_shape((3, 5, 32, 32)) == (4, 5, 8, 8) and fresh.latent_shape((3, 32, 32)) == (4, 1, 8, 8)


def test_an_image_and_its_one_frame_clip_never_share_an_entry(vae, tmp_path, caplog):
    image = _images(10, 1)
    clip = image.unsqueeze(2)  # the same pixels as a [1, 3, 1, H, W] clip
    assert lc.input_key(image[0]) != lc.input_key(clip[0])
    cache = lc.LatentCache(vae, tmp_path)
    cache.encode(image)
    cache.encode(clip)
    assert cache.misses == 2 and len(list(tmp_path.rglob("*.safetensors"))) == 2


def test_an_image_latent_where_a_clip_entry_belongs_is_refused(vae, tmp_path, caplog):
    clips = _clips(11, 1)
    writer = lc.LatentCache(vae, tmp_path)
    expected = writer.encode(clips)
    key = lc.input_key(clips[0])
    one_frame = expected[0, :, :1].contiguous()
    writer._path(key).write_bytes(latent_entry.entry_bytes(one_frame, key, writer.identity))
    with caplog.at_level(logging.WARNING, logger="cosmos_rl.models.latent_cache"):
        assert torch.equal(lc.LatentCache(vae, tmp_path).encode(clips), expected)
    (record,) = caplog.records
    assert "holds latents of shape (4, 1, 8, 8); this input's latents are (4, 5, 8, 8)" in record.getMessage()


def test_batch_keys_are_the_per_input_keys_entries_on_disk_were_written_under():
    from cosmos_rl.models.latent_keys import input_key, input_keys

    images = _images(3)
    clips = torch.rand(2, 3, 5, 16, 16, generator=torch.Generator().manual_seed(0))
    transposed = images.transpose(2, 3)  # not contiguous: keyed by its values as laid out per item
    for batch in (images, clips, transposed, images.to(torch.bfloat16), images[1:2]):
        keys = input_keys(batch)
        assert keys == [input_key(item) for item in batch]
        assert len(set(keys)) == len(keys)
    assert input_keys(images[:0]) == []
