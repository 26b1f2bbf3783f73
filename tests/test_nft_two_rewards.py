"""NFT trains on two rewards at once: a model reward (PickScore, a tiny random CLIP saved to a folder)
and a weight-free one (brightness), each pinned, with per-reward metrics: once on the built-in
loopback services the run starts itself, once on a Ray Serve deployment reached by URL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from _reward_models import tiny_clip_folder
from cosmos_rl.commands import launch
from cosmos_rl.config import load
from cosmos_rl.dist.addresses import free_loopback_port
from cosmos_rl.rewards.models import ClipRewardModel

pytestmark = pytest.mark.slow

SMOKE = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"
# One step: each reward's metrics and their weighted sum are in every row, so one row proves them.
# A group of 2 samples (2 actors, not the manifest's 4): the rows' per-reward metrics and their
# weighted sum do not depend on the group's size, and each actor's start imports the stack.
FAST = ["rl.max_steps=1", "rl.sample_steps=4", "rl.timesteps_per_sample=1", "job.progress=false",
        "rl.sample_grid_every=0", "checkpoint.every=0", "rl.group_size=2"]


def _manifest(tmp_path: Path, clip: Path, url: str = "") -> Path:
    """The smoke manifest with its one [rl.reward] table replaced by two [[rl.rewards]] tables; with
    `url` both are scored there, without it the run starts a built-in service per reward."""
    text = re.sub(r"\[rl\.reward\]\n(?:[^\n]+\n)*", "", SMOKE.read_text(), count=1)
    where = f"url = {json.dumps(url)}\n" if url else ""
    model = "" if url else f"model = {json.dumps(str(clip))}\n"
    pinned = f"reward_revision = {json.dumps(ClipRewardModel('pickscore', clip).revision)}\n"
    tables = (
        f'[[rl.rewards]]\nname = "pickscore"\nweight = 1.0\nrevision = "two-1"\n{pinned}{model}{where}\n'
        f'[[rl.rewards]]\nname = "brightness"\nweight = 0.5\nrevision = "two-1"\n{where}\n'
    )
    path = tmp_path / "two_rewards.toml"
    path.write_text(text.replace("[checkpoint]", tables + "[checkpoint]"))
    return path


def _train(manifest: Path, output: Path, *extra: str) -> list[dict]:
    overrides = [*FAST, f'job.output_dir="{output}"', *extra]
    config = load.load(manifest, overrides)
    assert len(config.rl.rewards) == 2
    assert launch.train(config, manifest, Console(stderr=True)) == 0
    run_dir = output / config.job.name
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check(rows: list[dict]) -> None:
    assert [r["step"] for r in rows] == [1]
    for row in rows:
        for name in ("pickscore", "brightness"):
            assert f"train/{name}/reward_mean" in row and f"train/{name}/reward_std" in row
        # train/reward_mean is the weighted sum's mean: 1.0 x pickscore + 0.5 x brightness
        expected = row["train/pickscore/reward_mean"] + 0.5 * row["train/brightness/reward_mean"]
        assert row["train/reward_mean"] == pytest.approx(expected, rel=1e-9)


def test_two_rewards_on_the_built_in_services(ray_cluster, tmp_path):
    clip = tiny_clip_folder(tmp_path / "clip")
    _check(_train(_manifest(tmp_path, clip), tmp_path / "out"))


def test_two_rewards_on_ray_serve(ray_cluster, tmp_path):
    from cosmos_rl.rewards.serve_ray import RayServeService

    clip = tiny_clip_folder(tmp_path / "clip")
    service = RayServeService("127.0.0.1", free_loopback_port(), "two-1", models={"pickscore": str(clip)},
                              replicas=2, cpus_per_replica=0.25)
    url = service.start()
    try:
        # The replicas hold 0.5 of the session cluster's 2 CPUs: the 2 ranks share the rest.
        rows = _train(_manifest(tmp_path, clip, url), tmp_path / "out", "grid.cpus_per_rank=0.25")
    finally:
        service.stop()
    _check(rows)
