"""DPO with context parallelism under torchrun (`grid.context_parallel`, docs/long_clips.md): the
smoke manifest's 2 gloo ranks as ONE context group (each rank holds 8 of an image's 16 vision
tokens) against the same run on one rank without it. Both train the same 4 pairs a step with the
same noise (the data cursor and the draws go by data-parallel rank), so every metric must agree:
the train/ rows, the held-out val/ pass and [rl.eval]'s eval/ score (sums counted once per group).
"""

from __future__ import annotations

import pytest
from _overrides import DPO_SMALL_WITH_VALIDATION
from test_dpo_torchrun import MANIFEST, cosmos, metrics_rows

pytestmark = pytest.mark.slow

SMALL = [*DPO_SMALL_WITH_VALIDATION, "rl.max_steps=2", "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1",
         'rl.eval.reward="brightness"']  # fmt: skip
ONE_RANK = ["grid.gpus_per_node=1", "model.config.parallelism.data_parallel_shard_degree=1"]


def test_two_ranks_as_one_context_group_train_what_one_rank_trains(tmp_path):
    out = f'job.output_dir="{tmp_path}"'
    cp = cosmos("train", str(MANIFEST), *SMALL, out, 'job.name="cp2"', "grid.context_parallel=2", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-3000:]
    one = cosmos("train", str(MANIFEST), *SMALL, *ONE_RANK, out, 'job.name="one"', cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]

    a, b = metrics_rows(tmp_path / "cp2"), metrics_rows(tmp_path / "one")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    assert a[0]["train/loss"] == pytest.approx(0.6931471805599453, abs=1e-6)  # policy = reference at step 1
    assert "val/dpo_accuracy" in a[1] and "eval/score" in a[1]
    for mine, theirs in zip(a, b):
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            if key.startswith(("train/", "val/", "eval/")) and isinstance(value, float):
                # float32 forwards whose attention runs on half the heads per rank and whose
                # gradients are a group mean: equal to float-order noise.
                print(f"step {mine['step']}, {key}: 2 ranks as one group {mine[key]!r}, one rank {value!r}")  # the measured gap (pytest -s)
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (mine["step"], key)
