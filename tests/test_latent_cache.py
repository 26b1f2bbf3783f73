"""The VAE latent cache: exact values, hits in memory and on disk, keyed by content and VAE identity."""

from __future__ import annotations

import pytest
import torch

from cosmos_rl.models import latent_cache as lc
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.vae import encode_images


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
    monkeypatch.setattr(lc, "encode_images", lambda *a: pytest.fail("the VAE ran on cached images"))
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
    assert lc.image_key(changed[0]) != lc.image_key(images[0])


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
