"""NFT's optimality map default (`rl.linear_map = "per_side"`, DiffusionNFT's A = 0 -> 0.5 for any
clamp) and the runs it must not change: run directories saved before the knob keep `span` (the map
they trained with), and every shipped manifest (a symmetric -5 / 5 clamp, where the two maps agree
bit for bit) keeps its run identity. The maps' numbers are in tests/test_nft_math.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_rl.config import load
from cosmos_rl.planning import plan

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "nft_t2i_smoke.toml"
NFT_MANIFESTS = sorted((ROOT / "manifests").glob("nft_*.toml"))
ASYMMETRIC = ["rl.advantage_low=-1.0"]  # high stays 5.0


def _identity(path: Path, overrides: list[str], saved_run: bool = False) -> str:
    return plan.run_identity(load.load(path, overrides, saved_run=saved_run))


@pytest.mark.parametrize("manifest", NFT_MANIFESTS, ids=lambda p: p.name)
def test_a_shipped_manifest_keeps_its_map_and_identity(manifest):
    config = load.load(manifest)
    # symmetric: per_side computes what span did, bit for bit (test_nft_math)
    assert config.rl.r_map == "linear" and config.rl.advantage_low == -config.rl.advantage_high
    assert config.rl.linear_map == "per_side"
    # span is the knob's value of before it existed, left out of the identity; per_side at a
    # symmetric clamp is left out too, so the identity is the one the manifest had before.
    assert "rl.linear_map" not in plan.identity_fields(config)
    assert _identity(manifest, []) == _identity(manifest, ['rl.linear_map="span"'])


def test_an_asymmetric_clamp_makes_the_map_part_of_the_identity():
    fields = plan.identity_fields(load.load(SMOKE, ASYMMETRIC))
    assert fields["rl.linear_map"] == "per_side"
    assert _identity(SMOKE, ASYMMETRIC) != _identity(SMOKE, [*ASYMMETRIC, 'rl.linear_map="span"'])
    # the sigmoid map never reads it
    sigmoid = [*ASYMMETRIC, 'rl.r_map="sigmoid"']
    assert _identity(SMOKE, sigmoid) == _identity(SMOKE, [*sigmoid, 'rl.linear_map="span"'])


def test_a_run_directory_saved_before_the_knob_keeps_the_span_map(tmp_path):
    """A saved manifest.toml written before rl.linear_map (an asymmetric clamp, no linear_map key)
    loads as `span` and hashes as a fresh manifest that writes span does."""
    resolved = load.to_toml(load.load(SMOKE, ASYMMETRIC))
    assert 'linear_map = "per_side"' in resolved
    saved = tmp_path / "manifest.toml"
    saved.write_text(resolved.replace('linear_map = "per_side"\n', ""))
    old = load.load(saved, saved_run=True)
    assert old.rl.linear_map == "span"
    assert plan.run_identity(old) == _identity(SMOKE, [*ASYMMETRIC, 'rl.linear_map="span"'])
    # a run saved with the knob keeps what it wrote
    (tmp_path / "new.toml").write_text(resolved)
    assert load.load(tmp_path / "new.toml", saved_run=True).rl.linear_map == "per_side"
