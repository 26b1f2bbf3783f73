"""`cosmos-rl train` / `resume` of the DPO smoke manifest under real torchrun (2 ranks, gloo, FSDP2, DCP).

One straight 4-step run and one 2-step run resumed with `--exact` to step 4: the metrics rows and
the final checkpoint tensors must be identical. Tiny sizes keep the three launches to ~1 min.

A SIGTERM to a `cosmos-rl` DPO run has no run of its own here: tests/test_group_signals.py signals
the run's process group (exit 75, one committed step with checkpoint.every=0, the `resume RUN
--exact` line) and tests/test_soak.py signals the launcher process alone, again and again (exit 75
each time, each resume --exact equal to a clean run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_rl.checkpoint import load_dcp, read_dcp_metadata
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from _inproc import cosmos as inproc_cosmos
from _overrides import DPO_SMALL, DPO_SMALL_WITH_VALIDATION

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "dpo_t2i_smoke.toml"
# ... and [rl.eval] every 2 steps (one prompt per task, brightness): the ranks' all-reduced eval/ rows.
SMALL = [*DPO_SMALL_WITH_VALIDATION, "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", 'rl.eval.reward="brightness"']


def cosmos(*args: str, cwd: Path):
    """`cosmos-rl ARGS` through the real CLI in this process (tests/_inproc.py): the runs' rows,
    checkpoints, exit codes and words are the subject, and the command still launches its torchrun
    ranks as processes; the SIGTERM test below keeps its own `cosmos-rl` process."""
    return inproc_cosmos(*args, cwd=cwd, env={"HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"})


def metrics_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "train/pairs_per_s"} for row in rows]  # wall-clock


def checkpoint_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    metadata = read_dcp_metadata(step_dir)
    state = {
        key: torch.empty(md.size, dtype=md.properties.dtype)
        for key, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    }
    load_dcp(state, step_dir)
    return state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo_torchrun")
    out = f'job.output_dir="{root}"'
    straight = cosmos("train", str(MANIFEST), *SMALL, out, 'job.name="straight"', "rl.max_steps=4", cwd=root)
    first = cosmos("train", str(MANIFEST), *SMALL, out, 'job.name="split"', "rl.max_steps=2", cwd=root)
    resumed = cosmos("resume", str(root / "split"), "--exact", "rl.max_steps=4", cwd=root)
    return root, straight, first, resumed


def test_train_writes_metrics_and_committed_checkpoints(runs):
    root, straight, _, _ = runs
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "cosmos_rl.dist.torchrun_quiet" in straight.stderr + straight.stdout  # the printed launch command
    run_dir = root / "straight"
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["train/loss"] == pytest.approx(0.6931471805599453, abs=1e-6)
    assert "val/dpo_accuracy" in rows[1] and "val/dpo_accuracy" in rows[3]
    assert [r["step"] for r in rows if "eval/score" in r] == [2, 4] and 0.0 < rows[3]["eval/score"] < 1.0
    for step in (2, 4):
        step_dir = run_dir / "checkpoints" / f"step_{step}"
        assert (step_dir / "COMMITTED").is_file()
        meta = json.loads((step_dir / "meta.json").read_text())
        assert meta["world_size"] == 2 and "ref" not in meta["components"]


def test_exact_resume_matches_the_straight_run(runs):
    root, straight, first, resumed = runs
    for proc in (straight, first, resumed):
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert metrics_rows(root / "split") == metrics_rows(root / "straight")
    a = checkpoint_tensors(root / "straight" / "checkpoints" / "step_4")
    b = checkpoint_tensors(root / "split" / "checkpoints" / "step_4")
    compared = [k for k in a if k.startswith(("policy.", "optimizer."))]
    assert any(k.startswith("policy.") for k in compared) and any(k.startswith("optimizer.") for k in compared)
    assert a.keys() == b.keys()
    for key in compared:
        assert torch.equal(a[key], b[key]), key


def test_exact_resume_with_a_changed_identity_field_exits_2_with_the_diff(runs):
    root, *_ = runs
    proc = cosmos("resume", str(root / "split"), "--exact", "rl.beta=10.0", cwd=root)
    assert proc.returncode == 2, proc.stderr
    assert "rl.beta" in proc.stderr and "500.0" in proc.stderr and "10.0" in proc.stderr


def test_a_bfloat16_run_trains_on_two_cpu_ranks(runs):
    """The public manifests' model.dtype on the CPU (docs/scale.md, "Precision"): 2 steps under
    torchrun, FSDP2 mixed precision over gloo, the fp32 master weights and AdamW state checkpointed."""
    root, straight, _, _ = runs
    proc = cosmos("train", str(MANIFEST), *DPO_SMALL, f'job.output_dir="{root}"', 'job.name="bf16"',
                  "rl.max_steps=2", 'model.dtype="bfloat16"', cwd=root)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics_rows(root / "bf16")
    assert [r["step"] for r in rows] == [1, 2]
    # Policy = reference at step 1 in bf16 too (both are the same bf16 forward of the base).
    assert rows[0]["train/loss"] == pytest.approx(0.6931471805599453, abs=1e-6)
    # The fp32 run's step 1 has the same pairs, noise and weights: bf16 compute moves the gradient
    # norm a little (measured 0.2%), and moves it at all (a silent fp32 run would match exactly).
    fp32 = metrics_rows(root / "straight")[0]["train/grad_norm"]
    assert rows[0]["train/grad_norm"] == pytest.approx(fp32, rel=0.02) and rows[0]["train/grad_norm"] != fp32
    assert rows[1]["train/loss"] < rows[0]["train/loss"]
    tensors = checkpoint_tensors(root / "bf16" / "checkpoints" / "step_2")
    saved = [k for k in tensors if k.startswith(("policy.", "optimizer."))]
    assert any(k.startswith("optimizer.") for k in saved)
    assert {tensors[k].dtype for k in saved} == {torch.float32}
