"""One-step-off scoring (rl.async_reward) in one process playing both ranks (tests/_nft_local.py):
the rollout of step k+1 runs while step k is scored and step k+1 is scored while step k trains,
with the numbers of the one-deep order; an exact resume from a checkpoint that holds the pending
rollout, and the reward-failure rule (the run commits step k-1 with rollout k pending).
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


def _scoring_threads() -> list[str]:
    from cosmos_rl.trainers.async_scoring import SCORING_THREAD

    return [t.name for t in threading.enumerate() if t.name.startswith(SCORING_THREAD)]


class _Events:
    """What a run did, in order; `wait` blocks until an event was recorded (a deadline only so a
    run that does not overlap fails instead of hanging)."""

    def __init__(self):
        self.seen: list[tuple[str, int]] = []
        self.changed = threading.Condition()

    def note(self, what: str, step: int) -> None:
        with self.changed:
            self.seen.append((what, step))
            self.changed.notify_all()

    def wait(self, what: str, step: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: (what, step) in self.seen, timeout=300)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """A straight async run of 3 steps (a checkpoint after each) whose reward and learn record the
    order of rollouts, scorings and learns: the scoring of step k waits until step k+1's rollout
    has begun, and learn(k) until step k+1's scoring has begun, which only a run that scores step
    k+1 during learn(k) can satisfy."""
    from _nft_local import local_trainer
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    root = tmp_path_factory.mktemp("async")
    config = _config(root, "straight", "checkpoint.every=1")
    trainer = local_trainer(config, root / "straight")
    events = _Events()
    rollout, score, learn = trainer.rollout, trainer.score, trainer.learn

    def recorded_rollout(step, *args, **kwargs):
        events.note("rollout begins", step)
        return rollout(step, *args, **kwargs)

    def recorded_learn(step, *args, **kwargs):
        events.note("learn begins", step)
        if step < STEPS:
            events.note("next scoring seen" if events.wait("scoring begins", step + 1) else "next scoring not seen", step)
        out = learn(step, *args, **kwargs)
        events.note("learn ends", step)
        return out

    calls = [0]

    def waiting_score(rank: int, pixels: np.ndarray, prompts):
        step = calls[0] // RANKS + 1  # each step scores each played rank once, in order
        calls[0] += 1
        if rank == 0:
            events.note("scoring begins", step)
            if step < STEPS:  # no step follows the last
                events.note("next rollout seen" if events.wait("rollout begins", step + 1) else "next rollout not seen", step)
        scores = score(rank, pixels, prompts)
        if rank == RANKS - 1:
            events.note("scoring ends", step)
        return scores

    trainer.rollout, trainer.score, trainer.learn = recorded_rollout, waiting_score, recorded_learn
    (root / "straight").mkdir()
    spec = LoopSpec(run_dir=root / "straight", start_step=trainer.build(False), resumed=False, main=True, unit="samples",
                    items_per_step=RANKS, progress_fields=tuple(trainer.progress_fields))  # fmt: skip
    run_steps(config, spec, trainer.train_step, trainer.save, lambda: None)
    threads_in_run = _scoring_threads()
    trainer.close()
    return {"root": root, "run": root / "straight", "events": events.seen, "config": config,
            "threads_in_run": threads_in_run, "threads_after_close": _scoring_threads()}  # fmt: skip


def test_the_next_step_is_rolled_out_and_scored_while_this_step_is_scored_and_trained(straight):
    events = straight["events"]
    at = events.index
    assert not [e for e in events if e[0].endswith("not seen")], events
    for step in range(1, STEPS):
        # step k's scoring began, then step k+1's rollout began, and only then did the scoring end
        assert at(("scoring begins", step)) < at(("rollout begins", step + 1)) < at(("scoring ends", step)), events
        # step k+1's scoring began before learn(k) ended and ended only after rollout k+2 began
        # (the last step's scoring waits for no rollout)
        assert at(("scoring ends", step)) <= at(("scoring begins", step + 1)) < at(("learn ends", step)), events
        if step + 1 < STEPS:
            assert at(("learn ends", step)) < at(("scoring ends", step + 1)), events
    assert events.count(("rollout begins", 1)) == 1 and ("rollout begins", STEPS + 1) not in events
    assert [r["step"] for r in _rows(straight["run"])] == [1, 2, 3]
    # The checkpoints hold the next step's rollout for each rank; the last one holds none.
    keys = [k for k in _saved(straight["run"], 1) if k.startswith("pending_rollout.")]
    assert len(keys) > RANKS * 3
    assert not [k for k in _saved(straight["run"], STEPS) if k.startswith("pending_rollout.") and not k.endswith(".json")]
    # One persistent scoring thread per trainer, gone after close
    assert len(straight["threads_in_run"]) == 1 and straight["threads_after_close"] == [], straight


def _scored_at_the_start_of_its_step(self, step: int) -> dict[str, float]:
    """The order of 2026-12-07 (one deep), the reference for the numbers: step k's call submits
    step k's scoring, rolls out k+1 meanwhile, waits, trains k; step k+1 is scored only in its own call."""
    from concurrent.futures import ThreadPoolExecutor

    from cosmos_rl.trainers.async_scoring import _Pending

    current = self.pending
    if current is None:
        batch = self._draw()
        current = _Pending(step, batch, self.rollout(step, batch.cond, batch.uncond, batch.condition, **batch.world))
    following = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        scoring = pool.submit(self._own_scores, current.rollouts, current.batch.texts)
        if step < self.rl.max_steps:
            batch = self._draw()
            following = _Pending(step + 1, batch, self.rollout(step + 1, batch.cond, batch.uncond, batch.condition, **batch.world))
        own, failures = scoring.result()
    assert not failures, failures
    tables = self._gather_scores(own, failures)
    metrics = self._learn_and_report(step, current.batch, current.rollouts, tables, 0.0, 0.0)
    self.pending = following
    return metrics


def test_scoring_two_deep_computes_the_numbers_of_the_one_deep_order(straight, tmp_path):
    """The deeper pipeline moves only when each scoring runs: same policy versions, same scores."""
    import types

    from _nft_local import local_trainer
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    config = _config(tmp_path, "one_deep", "checkpoint.every=1")
    run = tmp_path / "one_deep"
    run.mkdir()
    trainer = local_trainer(config, run)
    trainer._async_step = types.MethodType(_scored_at_the_start_of_its_step, trainer)
    spec = LoopSpec(run_dir=run, start_step=trainer.build(False), resumed=False, main=True, unit="samples",
                    items_per_step=RANKS, progress_fields=tuple(trainer.progress_fields))  # fmt: skip
    run_steps(config, spec, trainer.train_step, trainer.save, lambda: None)
    assert [r["step"] for r in _rows(run)] == [1, 2, 3]
    assert _rows(run) == _rows(straight["run"])
    for step in (1, STEPS):  # the weights, optimizer, cursor and pending rollout, bit for bit
        _assert_same_checkpoint(straight["run"], run, step)


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
    score, learn, calls, events = trainer.score, trainer.learn, [0], _Events()

    def failing_from_step_2(rank, pixels, prompts):
        calls[0] += 1
        if calls[0] > RANKS:
            events.note("scoring fails", calls[0] // RANKS + (calls[0] % RANKS > 0))
            raise RewardUnavailable(f"rank {rank}: the judge is down")
        return score(rank, pixels, prompts)

    def learn_waiting_for_the_failure(step, *args, **kwargs):
        if step == 1:  # step 2's scoring fails while learn(1) runs
            assert events.wait("scoring fails", 2), "step 2 was not scored during learn(1)"
        return learn(step, *args, **kwargs)

    trainer.score, trainer.learn = failing_from_step_2, learn_waiting_for_the_failure
    spec = LoopSpec(run_dir=run, start_step=trainer.build(False), resumed=False, main=True, unit="samples",
                    items_per_step=RANKS, progress_fields=tuple(trainer.progress_fields))  # fmt: skip
    with pytest.raises(RewardUnavailable, match="judge is down"):
        run_steps(config, spec, trainer.train_step, trainer.save, lambda: None)
    # Raised in step 2's call, not lost and not step 1's: step 1 trained and logged, step 2 did not.
    assert trainer.step == 1 and [r["step"] for r in _rows(run)] == [1]
    assert trainer.pending is not None and trainer.pending.step == 2  # rollout 3 was dropped
    assert trainer.pending.scoring is None and _scoring_threads() == []  # scored afresh by a later call
    trainer.save(1)  # what the Ray driver does on RewardUnavailable (trainers/ray_driver.py)
    _assert_same_checkpoint(straight["run"], run, 1)  # the cursor, and rollout 2 pending, as the straight run's

    run_local(config, run, resume=True)
    assert _rows(run) == _rows(straight["run"])
    _assert_same_checkpoint(straight["run"], run, STEPS)



class _Cursor:
    def __init__(self):
        self.at = 0

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.at = state["at"]


def _bare_async_trainer(max_steps: int, learn, own_scores):
    """`_async_step`'s control flow alone: an OnlineTrainer without a model whose draw, rollout,
    scoring, gather and learn are stand-ins (a rollout is its step's number)."""
    from types import SimpleNamespace

    from cosmos_rl.trainers.online import OnlineTrainer, _Batch

    trainer = OnlineTrainer.__new__(OnlineTrainer)
    trainer.rl = SimpleNamespace(max_steps=max_steps, async_reward=True)
    trainer.pending, trainer._scorer, trainer.cursor = None, None, _Cursor()

    def draw():
        before = trainer.cursor.state_dict()
        trainer.cursor.at += 1
        return _Batch([trainer.cursor.at], ["a prompt"], before, [], [], None, {})

    trainer._draw = draw
    trainer.rollout = lambda step, *args, **kwargs: [step]
    trainer._own_scores = own_scores
    trainer._gather_scores = lambda own, failures: {"reward": own}
    trainer._learn_and_report = lambda step, batch, rollouts, tables, *times: learn(step, rollouts, tables)
    return trainer


def test_an_error_of_step_2s_scoring_met_during_learn_1_is_raised_by_step_2_and_stops_the_thread():
    events = _Events()

    def own_scores(rollouts, texts):
        if rollouts == [2]:
            events.note("scoring fails", 2)
            raise ValueError("the reward function has a bug")
        return [[[1.0]]], {}

    def learn(step, rollouts, tables):
        if step == 1:
            assert events.wait("scoring fails", 2), "step 2 was not scored during learn(1)"
        return {"step": step, "rollout": rollouts[0]}

    trainer = _bare_async_trainer(3, learn, own_scores)
    assert trainer._async_step(1) == {"step": 1, "rollout": 1}  # step 1 is not charged with step 2's error
    assert trainer.pending.step == 2 and trainer.cursor.at == 2 and len(_scoring_threads()) == 1
    with pytest.raises(ValueError, match="has a bug"):
        trainer._async_step(2)
    # Step 3's draw undone, rollout 2 pending without its failed scoring, the thread stopped
    assert trainer.cursor.at == 2 and trainer.pending.step == 2 and trainer.pending.scoring is None
    assert _scoring_threads() == []
    # A later call scores rollout 2 afresh on a new thread
    trainer._own_scores = lambda rollouts, texts: ([[[1.0]]], {})
    assert trainer._async_step(2) == {"step": 2, "rollout": 2} and trainer.pending.step == 3
    trainer.close()
    assert _scoring_threads() == [] and trainer.pending.scoring is None  # the checkpoint's view: rollout 3, no scores


def test_a_failed_learn_drops_the_next_steps_scoring_and_stops_the_thread():
    def learn(step, rollouts, tables):
        raise RuntimeError("out of memory")

    trainer = _bare_async_trainer(3, learn, lambda rollouts, texts: ([[[1.0]]], {}))
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer._async_step(1)
    assert trainer.pending is None and _scoring_threads() == []


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
    assert "while learn(k) and rollout k+2 run" in plan.build(_config(tmp_path, "on"))["roles"]["reward"]
    assert "one policy version late" in plan.build(_config(tmp_path, "on"))["roles"]["replay"]
    assert "_async_step" not in plan.build(nft_off)["roles"]["reward"]
