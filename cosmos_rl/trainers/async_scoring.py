"""One-step-off scoring (rl.async_reward, docs/nft.md): step k+1's rollout is made and handed to a
scoring thread before step k trains, and the rollout waiting for its step is a checkpoint component.

The online trainer's machinery for it, apart from the synchronous step (trainers/online.py), which
takes it in as a base class: `_async_step` replaces `train_step`'s body when the flag is on.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from cosmos_rl.checkpoint import PlainState
from cosmos_rl.trainers.online_batch import Rollout, _Batch
from cosmos_rl.trainers.online_state import REWARD_FAILED

SCORING_THREAD = "cosmos-rl-score"  # the name prefix of a trainer's scoring thread (rl.async_reward)


class OneStepOffScoring:
    """The scoring thread and the pending rollout of an online trainer (`self.pending`, `self._scorer`,
    set by OnlineTrainer.__init__)."""

    def _async_step(self, step: int) -> dict[str, float]:
        """One-step-off scoring (rl.async_reward), two deep: step k's call makes rollout k+1 and
        hands it to the scoring thread at once, then waits for step k's scores and trains step k.
        Step k+1's scoring thus runs while learn(k), the save of k and rollout k+2 run; a steady
        step takes about max(rollout + learn, scoring) instead of max(rollout, scoring) + learn.

        Step k's rollout is the pending one (made by the call before, with its scoring already
        submitted; or loaded from a checkpoint, which never holds scores: it is scored now), else
        made now (the first step of a run). Only each rank's own reward calls run on the thread
        (`_own_scores`); the gather of the table stays on this thread, so every rank's collectives
        keep one order. Rollout k+1 is made by the policy before learn(k): one policy version late
        (docs/nft.md, "One-step-off scoring"), the same rollouts, scores and numbers whichever
        step's call waits for them.
        """
        t0 = time.perf_counter()
        current = self.pending
        if current is None:
            batch = self._draw()
            current = _Pending(step, batch, self.rollout(step, batch.cond, batch.uncond, batch.condition, **batch.world))
        assert current.step == step, f"the pending rollout is step {current.step}'s, not step {step}'s"
        following, drawn = None, None
        try:
            scoring = current.scoring if current.scoring is not None else self._submit_scoring(current)
            if step < self.rl.max_steps:
                drawn = batch = self._draw()
                following = _Pending(step + 1, batch, self.rollout(step + 1, batch.cond, batch.uncond, batch.condition, **batch.world))
                following = following._replace(scoring=self._submit_scoring(following))  # runs during learn(step)
            t1 = time.perf_counter()
            # Step k's own scores: a failure of its reward calls is reported here, in step k's call,
            # even when the thread met it during learn(k-1).
            own, failures = scoring.result()
            tables = self._gather_scores(own, failures)
        except BaseException:
            self._keep_pending(current, drawn)
            raise
        if tables is None:
            self._keep_pending(current, drawn)
            return {REWARD_FAILED: 1.0}
        self.pending = None  # learn may raise: no stale pending rollout survives a failed step
        try:
            metrics = self._learn_and_report(step, current.batch, current.rollouts, tables, t1 - t0, time.perf_counter() - t1)
        except BaseException:
            self.close()  # step + 1's scoring is dropped with the step; nothing of it is kept
            raise
        self.pending = following
        return metrics

    def _submit_scoring(self, pending: "_Pending") -> Future:
        """Start `pending`'s own reward calls on the trainer's scoring thread (one worker: the
        scorings run in step order). The future is never saved: a checkpoint holds the rollout."""
        if self._scorer is None:
            self._scorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=SCORING_THREAD)
        return self._scorer.submit(self._own_scores, pending.rollouts, pending.batch.texts)

    def _keep_pending(self, current: "_Pending", drawn: "_Batch | None") -> None:
        """A failed step before its learn (its scoring, the gather, rollout step + 1): step + 1's
        draw is undone and its rollout and scoring dropped; the cursor and the pending rollout are
        again what checkpoint step - 1 holds, and a call of the step again scores its rollout afresh."""
        self.close()
        if drawn is not None:
            self.cursor.load_state_dict(drawn.cursor_before)
        self.pending = current._replace(scoring=None)

    def close(self) -> None:
        """Stop the scoring thread: a scoring not begun is cancelled, one under way is waited for
        (its reward calls end within the client's retry budget) and its result dropped. A later
        step starts a new thread."""
        scorer, self._scorer = self._scorer, None
        if scorer is not None:
            scorer.shutdown(wait=True, cancel_futures=True)
        if self.pending is not None and self.pending.scoring is not None:
            self.pending = self.pending._replace(scoring=None)  # its future is gone with the thread


class _Pending(NamedTuple):
    """rl.async_reward: a step's rollout made before the step (one policy version early)."""

    step: int
    batch: _Batch
    rollouts: list[Rollout]
    scoring: Future | None = None  # its own scores under way on the scoring thread; never in a checkpoint


class _PendingState(PlainState):
    """The checkpoint component of the pending rollout (rl.async_reward), per rank: the played
    ranks' x0 latents, sigmas and pixels, the step, its rows and texts and the cursor before their
    draw; the prompt ids, I2V frames and action rows are made again from the rows. {} when none
    (the run's last step)."""

    def __init__(self, trainer):  # the OnlineTrainer whose pending rollout this is
        super().__init__(per_rank=True)
        self.trainer = trainer

    def capture(self) -> dict[str, Any]:
        pending = self.trainer.pending
        if pending is None:
            return {}
        return {
            "step": pending.step, "rows": list(pending.batch.rows), "texts": list(pending.batch.texts),
            "cursor_before": pending.batch.cursor_before,
            "rollouts": {str(rank): {"x0": x0, "sigmas": sigmas, "pixels": pixels}
                         for rank, (x0, sigmas, pixels) in zip(self.trainer.comm.ranks, pending.rollouts)},
        }  # fmt: skip

    def restore(self, data: dict[str, Any]) -> None:
        trainer = self.trainer
        if not data:
            trainer.pending = None
            return
        saved = sorted(int(rank) for rank in data["rollouts"])
        if saved != sorted(trainer.comm.ranks):
            raise ValueError(f"the pending rollout holds ranks {saved}, this process plays {list(trainer.comm.ranks)}")
        batch = trainer._batch_of([int(r) for r in data["rows"]], [str(t) for t in data["texts"]], data["cursor_before"])
        rollouts = []
        for rank in trainer.comm.ranks:
            one = data["rollouts"][str(rank)]  # x0 and sigmas live on the device, pixels on the CPU (as `sample` returns them)
            rollouts.append((one["x0"].to(trainer.device), one["sigmas"].to(trainer.device), one["pixels"]))
        trainer.pending = _Pending(int(data["step"]), batch, rollouts)
