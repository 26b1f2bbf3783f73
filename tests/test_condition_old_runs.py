"""Run directories written before `[model.condition]` (tests/fixtures/old_runs/condition_keys/: the
saved `manifest.toml` and the newest checkpoint's `meta.json` of three short runs of the shipped
manifests at commit 049272e, by `bench/house_parity.py capture`) load with their replaced keys as
the condition they meant, and hash to the identity and seed contract their checkpoints recorded,
which is what `resume` and `resume --exact` check: they resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosmos_rl.config import load
from cosmos_rl.planning import plan

RUNS = Path(__file__).resolve().parent / "fixtures" / "old_runs" / "condition_keys"
# run -> (its replaced key as saved, the condition it loads as: kind, source, probability)
EXPECTED = {
    "nft_i2v_shapes_cpu": ('first_frame = "shapes_world"', ("first_frame", "shapes_video", 1.0)),
    "nft_video_shapes_cpu": ('first_frame = "none"', ("none", "none", 1.0)),
    "sft_video_shapes_cpu": ("first_frame_condition = 0.5", ("first_frame", "data", 0.5)),
}


@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_an_old_run_directory_loads_its_condition_and_keeps_its_identity(run, capsys):
    saved, (kind, source, probability) = EXPECTED[run]
    manifest = RUNS / run / "manifest.toml"
    assert saved in manifest.read_text()  # the fixture is of before the change
    meta = json.loads((RUNS / run / "meta.json").read_text())
    config = load.load(manifest, saved_run=True)
    c = config.model.condition
    assert (c.kind, c.source, c.probability) == (kind, source, probability)
    assert plan.run_identity(config) == meta["run_identity"]
    contract = meta.get("extra", {}).get("seed_contract")
    if contract is not None:  # an online run's seed contract (resume --exact refuses any change)
        assert plan.seed_contract(config) == contract
    assert capsys.readouterr().err == ""  # a saved run's manifest loads quietly
