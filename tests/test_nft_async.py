"""One-step-off scoring (rl.async_reward) in one process playing both ranks (tests/_nft_local.py):
the rollout of step k+1 runs while step k is scored, an exact resume from a checkpoint that holds
the pending rollout, and the reward-failure rule (the run commits step k-1 with rollout k pending).
The smoke manifest, made small: 2 ranks, 1 prompt row, 4 sampler steps, 3 steps."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_rl.config import load
from cosmos_rl.core.errors import RewardUnavailable

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "nft_t2i_smoke.toml"
STEPS, RANKS = 3, 2
FAST = ["rl.sample_steps=4", "rl.timesteps_per_sample=2", "job.progress=false", "rl.sample_grid_every=0", "checkpoint.keep=0",
        f"rl.group_size={RANKS}", "rl.prompts_per_step=1", f"rl.max_steps={STEPS}", "rl.async_reward=true"]  # fmt: skip


def _config(tmp_path: Path, name: str, *extra: str):
    return load.load(SMOKE, [*FAST, f'job.output_dir="{tmp_path}"', f'job.name="{name}"', *extra])


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _saved(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of checkpoint `step` (weights, old policy, optimizer, pending rollout)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run_dir.parent / f"{run_dir.name}_{step}.pt"
    dcp_to_torch_save(str(run_dir / "checkpoints" / f"step_{step}"), str(out))
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(out, weights_only=True))
    return flat


def _assert_same_checkpoint(a: Path, b: Path, step: int) -> None:
    ta, tb = _saved(a, step), _saved(b, step)
    assert set(ta) == set(tb)
    assert any(k.startswith("policy.") for k in ta) and any(k.startswith("optimizer.") for k in ta)
    for key in ta:
        if key.startswith(("policy.", "old.", "optimizer.", "lr_schedule.", "data_cursor.", "progress.", "pending_rollout.")):
            assert torch.equal(ta[key], tb[key]), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """A straight async run of 3 steps (a checkpoint after each) whose reward records the order of
    rollouts and scorings: the scoring of step k waits until step k+1's rollout has begun, which
    only a run that overlaps them can satisfy."""
    from _nft_local import local_trainer
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    root = tmp_path_factory.mktemp("async")
    config = _config(root, "straight", "checkpoint.every=1")
    trainer = local_trainer(config, root / "straight")
    events: list[tuple[str, int]] = []
    began = threading.Condition()
    rollout, score = trainer.rollout, trainer.score

    def recorded_rollout(step, *args, **kwargs):
        with began:
            events.append(("rollout begins", step))
            began.notify_all()
        return rollout(step, *args, **kwargs)

    calls = [0]

    def waiting_score(rank: int, pixels: np.ndarray, prompts):
        step = calls[0] // RANKS + 1  # each step scores each played rank once, in order
        calls[0] += 1
        if rank == 0:
            events.append(("scoring begins", step))
            if step < STEPS:  # no step follows the last
                with began:
                    # A deadline only so a run that does not overlap fails instead of hanging.
                    overlapped = began.wait_for(lambda: ("rollout begins", step + 1) in events, timeout=300)
                events.append(("next rollout seen" if overlapped else "next rollout not seen", step))
        scores = score(rank, pixels, prompts)
        if rank == RANKS - 1:
            events.append(("scoring ends", step))
        return scores

    trainer.rollout, trainer.score = recorded_rollout, waiting_score
    (root / "straight").mkdir()
    spec = LoopSpec(run_dir=root / "straight", start_step=trainer.build(False), resumed=False, main=True, unit="samples",
                    items_per_step=RANKS, progress_fields=tuple(trainer.progress_fields))  # fmt: skip
    run_steps(config, spec, trainer.train_step, trainer.save, lambda: None)
    return {"root": root, "run": root / "straight", "events": events, "config": config}


def test_the_rollout_of_the_next_step_runs_while_this_step_is_scored(straight):
    events = straight["events"]
    at = events.index
    assert ("next rollout not seen", 1) not in events and ("next rollout not seen", 2) not in events
    for step in range(1, STEPS):
        # step k's scoring began, then step k+1's rollout began, and only then did the scoring end
        assert at(("scoring begins", step)) < at(("rollout begins", step + 1)) < at(("scoring ends", step)), events
        assert at(("scoring ends", step)) < at(("scoring begins", step + 1))  # learn(k) comes between
    assert events.count(("rollout begins", 1)) == 1 and ("rollout begins", STEPS + 1) not in events
    assert [r["step"] for r in _rows(straight["run"])] == [1, 2, 3]
    # The checkpoints hold the next step's rollout for each rank; the last one holds none.
    keys = [k for k in _saved(straight["run"], 1) if k.startswith("pending_rollout.")]
    assert len(keys) > RANKS * 3
    assert not [k for k in _saved(straight["run"], STEPS) if k.startswith("pending_rollout.") and not k.endswith(".json")]


def test_resume_from_a_checkpoint_with_a_pending_rollout_equals_the_straight_run(straight, tmp_path):
    from _nft_local import run_local

    run = tmp_path / "resumed"
    shutil.copytree(straight["run"], run)
    for step in range(2, STEPS + 1):  # as if the run had stopped after committing step 1
        shutil.rmtree(run / "checkpoints" / f"step_{step}")
    run_local(_config(tmp_path, "resumed", "checkpoint.every=1"), run, resume=True)
    assert _rows(run) == _rows(straight["run"])
    _assert_same_checkpoint(straight["run"], run, STEPS)


def test_a_reward_failure_commits_the_step_before_with_its_rollout_pending_and_resume_equals_the_straight_run(straight, tmp_path):
    from _nft_local import local_trainer, run_local
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    config = _config(tmp_path, "failing", "checkpoint.every=0")
    run = tmp_path / "failing"
    run.mkdir()
    trainer = local_trainer(config, run)
    score, calls = trainer.score, [0]

    def failing_from_step_2(rank, pixels, prompts):
        calls[0] += 1
        if calls[0] > RANKS:
            raise RewardUnavailable(f"rank {rank}: the judge is down")
        return score(rank, pixels, prompts)

    trainer.score = failing_from_step_2
    spec = LoopSpec(run_dir=run, start_step=trainer.build(False), resumed=False, main=True, unit="samples",
                    items_per_step=RANKS, progress_fields=tuple(trainer.progress_fields))  # fmt: skip
    with pytest.raises(RewardUnavailable, match="judge is down"):
        run_steps(config, spec, trainer.train_step, trainer.save, lambda: None)
    assert trainer.pending is not None and trainer.pending.step == 2  # rollout 3 was dropped
    trainer.save(1)  # what the Ray driver does on RewardUnavailable (trainers/ray_driver.py)
    _assert_same_checkpoint(straight["run"], run, 1)  # the cursor, and rollout 2 pending, as the straight run's

    run_local(config, run, resume=True)
    assert _rows(run) == _rows(straight["run"])
    _assert_same_checkpoint(straight["run"], run, STEPS)



def test_preflight_refuses_async_reward_on_grpo_and_the_seed_contract_carries_it(tmp_path):
    from cosmos_rl.config import preflight
    from cosmos_rl.planning import plan

    out = f'job.output_dir="{tmp_path}"'
    grpo = load.load(ROOT / "manifests" / "grpo_t2i_public_4gpu.toml", [out, "rl.async_reward=true"])
    errors = [(p.path, p.severity) for p in preflight.check(grpo) if p.severity == "error"]
    assert ("rl.async_reward", "error") in errors, errors
    nft_off = load.load(SMOKE, [out])
    assert not [p for p in preflight.check(_config(tmp_path, "on")) if p.path == "rl.async_reward"]
    # Off, the contract is the one runs recorded before the knob (they still resume); on, it is in it.
    assert "rl.async_reward" not in plan.seed_contract(nft_off)
    assert plan.seed_contract(_config(tmp_path, "on"))["rl.async_reward"] is True
    # `cosmos-rl plan` says who scores and what the replay is
    assert "_async_step" in plan.build(_config(tmp_path, "on"))["roles"]["reward"]
    assert "one policy version late" in plan.build(_config(tmp_path, "on"))["roles"]["replay"]
    assert "_async_step" not in plan.build(nft_off)["roles"]["reward"]
