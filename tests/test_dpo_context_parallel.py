"""DPO and SFT with context parallelism under torchrun (`grid.context_parallel`, docs/long_clips.md):
2 gloo ranks as ONE context group (each rank holds 8 of an image's 16 vision tokens) against the
same run on one rank without it. Both train the same data a step with the same noise (the data
cursor and the draws go by data-parallel rank), so every metric must agree: the train/ rows, DPO's
held-out val/ pass and [rl.eval]'s eval/ score (sums counted once per group).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _overrides import DPO_SMALL_WITH_VALIDATION
from test_dpo_torchrun import MANIFEST, cosmos, metrics_rows

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EVAL = ["rl.max_steps=2", "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", 'rl.eval.reward="brightness"']
DPO = [*DPO_SMALL_WITH_VALIDATION, *EVAL]
# SFT: the tiny preset (4 heads, 16 vision tokens at 32x32) fully fine-tuned on 2 shapes images a
# step; caption dropout at 0.5 so its draws (by data-parallel rank) drop some caption in these 2 steps.
# A checkpoint every step: the one-rank run is also tests/test_sft.py's one-rank `cosmos-rl train`
# of the transformer under torchrun, whose committed checkpoint is checked below (one launch fewer).
SFT = ['model.preset="tiny"', "rl.samples_per_step=2", "job.progress=false", "job.log_every=1", "checkpoint.every=1",
       "rl.caption_dropout=0.5", "rl.eval.sample_steps=2", *EVAL]  # fmt: skip
TWO_RANKS = ["grid.gpus_per_node=2", "model.config.parallelism.data_parallel_shard_degree=2"]
ONE_RANK = ["grid.gpus_per_node=1", "model.config.parallelism.data_parallel_shard_degree=1"]


def _case(algorithm: str, tmp_path: Path) -> tuple[Path, list[str]]:
    if algorithm == "dpo":
        return MANIFEST, DPO
    from cosmos_rl.shapes import Group, Spec, write_shards

    specs = [Spec((Group("circle", "red"),)), Spec((Group("square", "blue", 2),)), Spec((Group("triangle"),))]
    shards = [str(p) for p in write_shards(tmp_path / "shards", specs * 2, seed=0)]
    return REPO / "manifests" / "sft_shapes_cpu.toml", [*SFT, f"rl.data.shards={json.dumps(shards)}"]


@pytest.mark.parametrize("algorithm", ["dpo", "sft"])
def test_two_ranks_as_one_context_group_train_what_one_rank_trains(tmp_path, algorithm):
    manifest, small = _case(algorithm, tmp_path)
    out = f'job.output_dir="{tmp_path}"'
    cp = cosmos("train", str(manifest), *small, *TWO_RANKS, out, 'job.name="cp2"', "grid.context_parallel=2", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-3000:]
    one = cosmos("train", str(manifest), *small, *ONE_RANK, out, 'job.name="one"', cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]

    a, b = metrics_rows(tmp_path / "cp2"), metrics_rows(tmp_path / "one")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    if algorithm == "dpo":
        assert a[0]["train/loss"] == pytest.approx(0.6931471805599453, abs=1e-6)  # policy = reference at step 1
        assert "val/dpo_accuracy" in a[1]
    else:
        assert a[0]["train/loss"] > 0 and a[0]["train/grad_norm"] > 0
        assert any(r["train/caption_dropped"] > 0 for r in a)  # the dropout draws are compared too
    assert "eval/score" in a[1]
    if algorithm == "sft":
        # `cosmos-rl train` of SFT (transformer mode) on one torchrun rank: its committed step-2
        # checkpoint and its eval/ row on the [rl.eval] step only.
        step_2 = tmp_path / "one" / "checkpoints" / "step_2"
        assert (step_2 / "COMMITTED").is_file()
        meta = json.loads((step_2 / "meta.json").read_text())
        assert meta["algorithm"] == "sft" and "policy" in meta["components"] and meta["world_size"] == 1
        assert "eval/score" in b[1] and "eval/score" not in b[0]
    for mine, theirs in zip(a, b):
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            if key.startswith(("train/", "val/", "eval/")) and isinstance(value, float) and not key.endswith("_per_s"):
                # float32 forwards whose attention runs on half the heads per rank and whose
                # gradients are a group mean: equal to float-order noise.
                print(f"{algorithm} step {mine['step']}, {key}: 2 ranks as one group {mine[key]!r}, one rank {value!r}")  # the measured gap (pytest -s)
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (mine["step"], key)
