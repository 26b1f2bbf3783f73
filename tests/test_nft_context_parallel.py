"""NFT with context parallelism on Ray (`grid.context_parallel`, docs/long_clips.md): a group of 2
samples, each on a context group of 2 ranks, so 4 actors of which consecutive pairs share a sample.

Text-to-video at the tiny sizes of tests/test_nft_video.py (5 frames at 32x32: 3 latent frames of
4x4 cells, 48 vision tokens, 24 per rank), brightness frame by frame through the built-in service.
One straight 2-step run, one run of 1 step resumed with --exact to 2 (bit-equal), and step 1 of the
straight run (and [rl.eval] after step 2) against the test-only local group playing both samples in
one process without context parallelism: the wiring must feed each context group the samples a
whole rank would get.

GRPO (the same online step with its SDE sampler) runs once the same way: one 2-step T2V run of
2 samples x 2 ranks, its step 1 (metrics and the moving-average adapter) against the local group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from cosmos_rl.config import load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "nft_video_shapes_cpu.toml"
TINY = [
    "model.num_frames=5", "rl.group_size=2", "rl.prompts_per_step=1", "rl.timesteps_per_sample=1",
    "job.progress=false", "job.log_every=1", "checkpoint.keep=0", 'rl.reward.name="brightness"',
    'rl.advantage_std_scope="group"', "rl.sample_steps=2", "checkpoint.every=1",
    # [rl.eval] after step 2: one held-out prompt per task, shared over the 2 data-parallel ranks,
    # scored by brightness through a served reward (each actor's own loopback service): these tiny
    # clips score 0 with the video verifier, strict and partial (measured), which would hide a miscount.
    "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", "rl.eval.sample_steps=2",
    'rl.eval.rewards=[{name="brightness", revision="builtin-v1"}]',
    f'rl.prompts.file="{REPO / "manifests" / "shapes_video_train.txt"}"',
]  # fmt: skip
CP = ["grid.context_parallel=2"]


def _config(tmp_path: Path, *extra: str):
    return load.load(MANIFEST, [*TINY, f'job.output_dir="{tmp_path}"', *extra])


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def test_context_parallel_nft_on_four_actors_resumes_exactly_and_equals_one_rank_per_sample(ray_cluster, tmp_path, monkeypatch):
    from test_nft_ray import _checkpoint_tensors

    from cosmos_rl.commands import launch
    from cosmos_rl.planning import plan
    from cosmos_rl.rewards.app import RewardApp

    # Every sample scored once, by its context group's first rank: count the requests the built-in
    # service (a thread of this process) gets; an image reward on clips is one request per clip, of
    # its 5 frames.
    scored: list[int] = []
    prepare = RewardApp._prepare

    def counted(self, body):
        fields, opened = prepare(self, body)
        scored.append(len(fields.prompts))
        return fields, opened

    monkeypatch.setattr(RewardApp, "_prepare", counted)

    straight_config = _config(tmp_path, *CP, 'job.name="straight"', "rl.max_steps=2")
    assert plan.world_size(straight_config)[0] == 4  # 2 samples x 2 ranks each
    assert launch.train(straight_config, MANIFEST, Console(stderr=True)) == 0
    assert scored == [5] * (2 * 2)  # 2 steps x 2 clips, not x 2 ranks per clip
    split_config = _config(tmp_path, *CP, 'job.name="split"', "rl.max_steps=1")
    assert launch.train(split_config, MANIFEST, Console(stderr=True)) == 0
    assert launch.resume(tmp_path / "split", ["rl.max_steps=2"], exact=True, console=Console(stderr=True)) == 0

    straight, split = _rows(tmp_path / "straight"), _rows(tmp_path / "split")
    assert [r["step"] for r in straight] == [1, 2] and all(r["train/grad_norm"] > 0 for r in straight)
    assert straight[0]["train/reward_std"] > 0  # the samples differ: advantages, a real step
    assert [_deterministic(r) for r in straight] == [_deterministic(r) for r in split]
    a, b = (_checkpoint_tensors(tmp_path / name, 2, tmp_path) for name in ("straight", "split"))
    weights = [k for k in a if k.startswith(("policy.", "old.", "optimizer."))]
    assert weights and any(k.startswith("old.") for k in weights) and set(weights) <= set(b)
    for key in weights:
        assert torch.equal(a[key], b[key]), key

    # Step 1 without context parallelism: one process plays both samples of the group.
    from _nft_local import local_trainer

    trainer = local_trainer(_config(tmp_path, 'job.name="local"', "rl.max_steps=2"), tmp_path / "local")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each actor uses: CPU kernels block their sums by thread count
    try:
        trainer.build(resume=False)
        local = trainer.train_step(1)
        trainer.train_step(2)
        local_eval = trainer.evaluate(2)
    finally:
        torch.set_num_threads(threads)
    # The rollouts (hence rewards) are the same samples exactly: same seeds by data-parallel rank,
    # and a context-parallel forward equals the whole one (tests/test_context_parallel.py).
    assert local["train/reward_mean"] == straight[0]["train/reward_mean"]
    assert local["train/reward_std"] == straight[0]["train/reward_std"]
    # Losses and gradients to float-order noise: FSDP2 over 4 ranks and the group mean of the
    # sharded backward may sum in another order than one process (measured: bit-equal here).
    for key in ("train/loss", "train/policy_loss", "train/grad_norm", "train/positive_error", "train/advantage_mean"):
        print(f"step 1, {key}: one process {local[key]!r}, 2 x 2 ranks {straight[0][key]!r}")  # the measured gap (pytest -s)
        assert local[key] == pytest.approx(straight[0][key], rel=1e-6, abs=1e-9), key
    # [rl.eval] on the data-parallel shares, each item's score summed once per context group.
    print(f"step 2, eval/score: one process {local_eval['eval/score']!r}, 2 x 2 ranks {straight[1]['eval/score']!r}")
    assert 0.0 < straight[1]["eval/score"] <= 1.0
    assert local_eval["eval/score"] == pytest.approx(straight[1]["eval/score"], abs=1e-6)


GRPO_MANIFEST = REPO / "manifests" / "grpo_video_shapes_cpu.toml"
GRPO_TINY = [
    "model.num_frames=5", "rl.group_size=2", "rl.prompts_per_step=1", "rl.sample_steps=3", "rl.sde_window=1",
    "rl.sde_window_range=[]", "rl.ema_every=1", "job.progress=false", "job.log_every=1", "checkpoint.keep=0",
    "checkpoint.every=1", "rl.eval.every=0", "rl.sample_grid_every=0", "rl.max_steps=2", 'rl.reward.name="brightness"',
    "rl.kl_beta=0.04",  # the reference's forward (adapters off) runs context parallel too
    f'rl.prompts.file="{REPO / "manifests" / "shapes_video_train.txt"}"',
]  # fmt: skip


def test_context_parallel_grpo_on_four_actors_equals_one_rank_per_sample(ray_cluster, tmp_path, monkeypatch):
    from _nft_local import local_trainer
    from test_nft_ray import _checkpoint_tensors

    from cosmos_rl.checkpoint.policy import AdapterState
    from cosmos_rl.commands import launch
    from cosmos_rl.planning import plan
    from cosmos_rl.rewards.app import RewardApp
    from cosmos_rl.trainers.online import EMA

    scored: list[int] = []
    prepare = RewardApp._prepare

    def counted(self, body):
        fields, opened = prepare(self, body)
        scored.append(len(fields.prompts))
        return fields, opened

    monkeypatch.setattr(RewardApp, "_prepare", counted)
    config = load.load(GRPO_MANIFEST, [*GRPO_TINY, f'job.output_dir="{tmp_path}"', *CP, 'job.name="cp"'])
    assert plan.world_size(config)[0] == 4  # 2 samples x 2 ranks each
    assert launch.train(config, GRPO_MANIFEST, Console(stderr=True)) == 0
    assert scored == [5] * (2 * 2)  # 2 steps x 2 clips, each scored once (frame by frame, 5 frames)
    rows = _rows(tmp_path / "cp")
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/grad_norm"] > 0 for r in rows)
    assert rows[0]["train/reward_std"] > 0  # the samples differ: advantages, a real step

    local_config = load.load(GRPO_MANIFEST, [*GRPO_TINY, f'job.output_dir="{tmp_path}"', 'job.name="local"'])
    trainer = local_trainer(local_config, tmp_path / "local")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each actor uses: CPU kernels block their sums by thread count
    try:
        trainer.build(resume=False)
        local = trainer.train_step(1)
        local_ema = {k: v.detach().clone() for k, v in AdapterState(trainer.transformer, EMA).state_dict().items()}
        second = trainer.train_step(2)
    finally:
        torch.set_num_threads(threads)
    # The same SDE noise by data-parallel rank and whole velocities on every rank of a context
    # group: the same clips, so the same rewards.
    assert local["train/reward_mean"] == rows[0]["train/reward_mean"]
    assert local["train/reward_std"] == rows[0]["train/reward_std"]
    for key in ("train/loss", "train/policy_loss", "train/ratio_mean", "train/kl", "train/grad_norm", "train/advantage_mean"):
        print(f"step 1, {key}: one process {local[key]!r}, 2 x 2 ranks {rows[0][key]!r}")  # the measured gap (pytest -s)
        assert local[key] == pytest.approx(rows[0][key], rel=1e-6, abs=1e-9), key
    # Step 2 starts from the moved policy: the reference's KL is no longer 0, so the reference
    # forward (adapters off) is compared too; the rollouts are again the same clips.
    assert second["train/kl"] > 0
    assert second["train/reward_mean"] == pytest.approx(rows[1]["train/reward_mean"], rel=1e-6)
    for key in ("train/kl", "train/grad_norm", "train/ratio_mean"):
        print(f"step 2, {key}: one process {second[key]!r}, 2 x 2 ranks {rows[1][key]!r}")
        assert second[key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-9), key
    # The moving average after step 1: the same blend of the same policy on every rank.
    saved = _checkpoint_tensors(tmp_path / "cp", 1, tmp_path)
    assert local_ema
    gap = max(float((saved[f"{EMA}.{name}"] - value.float()).abs().max()) for name, value in local_ema.items())
    print(f"step 1, ema adapter: largest gap {gap!r}")
    assert gap <= 1e-6
