"""The GPU user's video path on CPU: the shipped public T2V manifests (manifests/*_t2v_public_8gpu.toml),
pointed at a Cosmos3-Nano-layout video folder (sound and action heads in the transformer, a VAE
that compresses time 4x, the chat tokenizer: the video system prompt and sentences), train to the
end with only the overrides docs/video.md lists: NFT on the session's Ray cluster with PickScore
(a tiny random CLIP folder served by URL) scoring every 4th frame, DPO under torchrun on a few
clip pairs this test writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _clip_helpers import squares_clip
from _reward_models import tiny_clip_folder
from _video_folders import video_nano_folder
from rich.console import Console

from cosmos_rl.commands import launch
from cosmos_rl.config import load
from cosmos_rl.data.clip_files import encode_clip

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NFT = REPO / "manifests" / "nft_t2v_public_8gpu.toml"
DPO = REPO / "manifests" / "dpo_t2v_public_8gpu.toml"
FRAMES = 17  # the manifests' own: 5 latent frames with the folder's 4x temporal VAE


@pytest.fixture(scope="module")
def nano(tmp_path_factory) -> Path:
    return video_nano_folder(tmp_path_factory.mktemp("video_nano") / "cosmos3-nano", seed=2)


def _cpu(folder: Path, output_dir: Path, steps: int) -> list[str]:
    """The overrides of docs/video.md "On a CPU first" that both manifests take
    (NFT's base, sampler steps and reward, and DPO's pairs, are the tests' own)."""
    return [
        f'model.path="{folder}"', 'grid.device="cpu"', 'model.dtype="float32"', "model.height=32", "model.width=32",
        f"rl.max_steps={steps}", f'job.output_dir="{output_dir}"',
    ]  # fmt: skip


def _train(manifest: Path, overrides: list[str], steps: int) -> list[dict]:
    config = load.load(manifest, overrides)
    assert launch.train(config, manifest, Console(stderr=True)) == 0
    run_dir = Path(config.job.output_dir) / config.job.name
    assert (run_dir / "checkpoints" / f"step_{steps}" / "COMMITTED").is_file()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


# Two Ray actors instead of eight (docs/video.md lists it as optional): eight train too, but their
# start-up alone took 78 s on the 2 shared cores against 15 s for two.
TWO_ACTORS = ["rl.group_size=2", "grid.shapes={policy=[1,2], rollout=[1,2]}"]
# Two torchrun ranks instead of eight, as tests/test_real_checkpoint.py runs the 4-GPU DPO manifest.
TWO_RANKS = ["grid.gpus_per_node=2", "model.config.parallelism.data_parallel_shard_degree=2", "rl.pairs_per_step=4"]


def test_the_public_t2v_nft_manifest_trains_from_a_nano_folder(ray_cluster, nano, tmp_path):
    import attrs

    from cosmos_rl.rewards.registry import build_registry
    from cosmos_rl.rewards.server import RewardServer

    # PickScore as `cosmos-rl reward serve --revision pick-v1 --model pickscore=FOLDER` serves it (the
    # manifest's revision), recording what it is asked to score.
    registry = build_registry({"pickscore": str(tiny_clip_folder(tmp_path / "clip"))})
    pick, scored = registry["pickscore"], []
    registry["pickscore"] = attrs.evolve(pick, fn=lambda images, prompts: scored.append((images.shape, list(prompts))) or pick.fn(images, prompts))
    with RewardServer("127.0.0.1", 0, revision="pick-v1", registry=registry) as server:
        overrides = _cpu(nano, tmp_path, 1) + [f'rl.init_from="{nano}"', "rl.sample_steps=4", f'rl.reward.url="{server.url}"']
        rows = _train(NFT, overrides + TWO_ACTORS, 1)
    assert [row["step"] for row in rows] == [1]
    row = rows[0]
    # Four clips (two rows, one clip per rank), frames 0, 4, 8, 12 and 16 of each scored as 32x32
    # images against the clip's own prompt: 20 images, each row's prompt 2 ranks x 5 frames times.
    assert sum(shape[0] for shape, _ in scored) == 4 * 5 and all(shape[1:] == (32, 32, 3) for shape, _ in scored)
    prompts = [prompt for _, batch in scored for prompt in batch]
    assert len(set(prompts)) <= 2 and all(prompts.count(prompt) % 10 == 0 for prompt in prompts)
    # Their means are the clips' scores: finite, differing within the group, a real step.
    assert math.isfinite(row["train/reward_mean"]) and row["train/reward_std"] > 0
    assert math.isfinite(row["train/loss"]) and row["train/grad_norm"] > 0


def _pairs(folder: Path, count: int) -> Path:
    """`count` clip pairs as a user's JSONL names them: a moving clip beats the same clip frozen and dimmed."""
    (folder / "clips").mkdir(parents=True)
    rows = []
    for i in range(count):
        winner = squares_clip(FRAMES)
        loser = (winner[:1].repeat(FRAMES, axis=0) // 2).astype(winner.dtype)
        for side, frames in (("w", winner), ("l", loser)):
            (folder / "clips" / f"{i}_{side}.mp4").write_bytes(encode_clip(frames, 16.0))
        rows.append({"id": f"pair-{i}", "prompt": "a red square moving right", "winner": f"clips/{i}_w.mp4", "loser": f"clips/{i}_l.mp4"})
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "pairs.jsonl"


def test_the_public_t2v_dpo_manifest_trains_from_a_nano_folder(nano, tmp_path):
    pairs = _pairs(tmp_path / "data", 4)
    rows = _train(DPO, _cpu(nano, tmp_path, 1) + TWO_RANKS + [f'rl.data.jsonl="{pairs}"'], 1)
    assert [row["step"] for row in rows] == [1]
    assert math.isfinite(rows[0]["train/loss"]) and rows[0]["train/loss"] > 0 and rows[0]["train/grad_norm"] > 0
