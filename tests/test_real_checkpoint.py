"""The GPU user's path on CPU: the shipped public manifests, pointed at a Cosmos3-Nano-layout folder
(sound and action heads in the transformer, written by diffusers' save_pretrained), train to the
end with only the device/size/steps overrides; and an s3:// base is pulled once for all ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _models_helpers import nano_folder
from _s3_server import CREDENTIALS, CountingS3Server
from rich.console import Console

from cosmos_rl.commands import launch
from cosmos_rl.config import load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NFT = REPO / "manifests" / "nft_t2i_public_4gpu.toml"
DPO = REPO / "manifests" / "dpo_t2i_public_4gpu.toml"
GRPO = REPO / "manifests" / "grpo_t2i_public_4gpu.toml"
STEPS = 2


@pytest.fixture(scope="module")
def nano(tmp_path_factory) -> Path:
    return nano_folder(tmp_path_factory.mktemp("nano") / "cosmos3-nano", seed=1, flow_shift=3.0)


def _cpu(folder: Path, output_dir: Path, init_from: str) -> list[str]:
    """The model/device/size/steps overrides a user with a Nano folder gives on a CPU machine."""
    return [
        f'model.path="{folder}"', f'rl.init_from="{init_from}"', 'grid.device="cpu"', 'model.dtype="float32"',
        "model.image_size=32", f"rl.max_steps={STEPS}", f'job.output_dir="{output_dir}"',
    ]  # fmt: skip


def _train(manifest: Path, overrides: list[str]) -> list[dict]:
    config = load.load(manifest, overrides)
    assert launch.train(config, manifest, Console(stderr=True)) == 0
    run_dir = Path(config.job.output_dir) / config.job.name
    assert (run_dir / "checkpoints" / f"step_{STEPS}" / "COMMITTED").is_file()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


# Two Ray actors instead of four (docs/quickstart.md lists it as optional): what a user's CPU check
# proves, the manifest training end to end from the folder, does not depend on the group's size, and
# each actor's start imports the stack (tests/test_public_video.py runs the video manifests so too).
TWO_ACTORS = ["rl.group_size=2", "grid.shapes={policy=[1,2], rollout=[1,2]}"]


def test_the_public_nft_manifest_trains_from_a_nano_folder(ray_cluster, nano, tmp_path):
    overrides = _cpu(nano, tmp_path, str(nano)) + [
        'rl.profile="t2i_tiny"', "rl.sample_steps=4", 'rl.reward.url=""', *TWO_ACTORS,
    ]  # fmt: skip
    rows = _train(NFT, overrides)
    assert [row["step"] for row in rows] == [1, 2]
    # jpeg_compressibility scores are negative bits per pixel: finite is what a scored rollout gives.
    assert all(math.isfinite(row["train/reward_mean"]) and math.isfinite(row["train/loss"]) for row in rows)


def test_the_public_grpo_manifest_trains_from_a_nano_folder(ray_cluster, nano, tmp_path):
    # Plain Flow-GRPO at 4 sampler steps: floor(0.99 x 4) = 3 SDE steps per sample train, guided (CFG 3).
    overrides = _cpu(nano, tmp_path, str(nano)) + ["rl.sample_steps=4", 'rl.reward.url=""', *TWO_ACTORS]
    rows = _train(GRPO, overrides)
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(row["train/reward_mean"]) and math.isfinite(row["train/loss"]) for row in rows)
    # On-policy: the recomputed log-prob of each recorded SDE step is the recorded one.
    assert all(row["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4) for row in rows)


DPO_FOUR_PAIRS = [
    "grid.gpus_per_node=2", "model.config.parallelism.data_parallel_shard_degree=2",
    "rl.pairs_per_step=4", "rl.data.synthetic_pairs=16",
]  # fmt: skip


def test_the_public_dpo_manifest_trains_from_a_nano_folder_whose_s3_base_is_pulled_once_for_both_ranks(nano, tmp_path, monkeypatch):
    """One run for both claims: a base in s3:// is pulled into a local folder and loaded from there
    as a local rl.init_from is (models/base_checkpoint.py), so this run is also the local folder's
    (the T2V DPO manifest from a Nano folder's own weights is tests/test_public_video.py's)."""
    server = CountingS3Server().start()
    try:
        import boto3

        for name, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint}.items():
            monkeypatch.setenv(name, value)  # inherited by torchrun and its ranks
        client = boto3.client("s3")
        client.create_bucket(Bucket="bases")
        files = sorted(p for p in nano.rglob("*") if p.is_file())
        for path in files:
            client.upload_file(str(path), "bases", f"nano/{path.relative_to(nano).as_posix()}")
        server.requests.clear()
        rows = _train(DPO, _cpu(nano, tmp_path, "s3://bases/nano") + DPO_FOUR_PAIRS)
        assert [row["step"] for row in rows] == [1, 2]
        assert all(math.isfinite(row["train/loss"]) and row["train/loss"] > 0 for row in rows)
        assert server.object_gets() == {f"bases/nano/{p.relative_to(nano).as_posix()}": 1 for p in files}
    finally:
        server.stop()
