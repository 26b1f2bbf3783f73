"""The online trainer's rewards: each played rank's own reward calls, and the one gather that makes
every reward's (and dimension's) [rows, G] score table on every rank.

Kept apart from the step (trainers/online.py takes it in as a base class): the scoring thread of
rl.async_reward (trainers/async_scoring.py) runs `_own_scores` alone, the gather stays on the
trainer's thread so every rank's collectives keep one order.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from cosmos_rl.core.errors import RewardUnavailable
from cosmos_rl.trainers.online_batch import Rollout
from cosmos_rl.trainers.online_policy import executed_actions

# (rank, uint8 images [rows, H, W, 3], prompts) -> {reward name: one score per image}, plus
# {`reward.dimension`: values} for each name in the function's `dimensions` attribute, when it has one.
# A policy-mode run also passes `actions=` (float64 [rows, n, width]: each sample's executed rows).
ScoreFn = Callable[[int, np.ndarray, Sequence[str]], dict[str, list[float]]]


class RewardTables:
    """Scores of a step's rollouts (`self.score`, `self.comm`, `self.reward_weights`,
    `self.dimension_names`, set by OnlineTrainer.__init__)."""

    def _scores(self, rollouts: list[Rollout], texts: list[str]) -> dict[str, torch.Tensor] | None:
        """Each reward's [rows, G] table, every rank's images scored; None when another rank's
        reward call failed for good (this rank's own failure raises RewardUnavailable)."""
        own, failures = self._own_scores(rollouts, texts)
        return self._gather_scores(own, failures)

    def _own_scores(self, rollouts: list[Rollout], texts: list[str]) -> tuple[list[list[list[float]]], dict[int, str]]:
        """The played ranks' own reward calls, no collective: ([rewards][rows] scores per played
        rank, rank -> why its call failed for good). Runs on the scoring thread with rl.async_reward."""
        own, failures = [], {}
        names = self._table_names()
        for rank, rollout in zip(self.comm.ranks, rollouts):
            pixels = rollout[2]
            if not self.comm.scores:
                # Context parallelism: the group's first rank scores this sample (the gather keeps
                # its row); finite placeholders, never read, so no failure is signalled.
                own.append([[0.0] * len(texts) for _ in names])
                continue
            try:
                generated = getattr(rollout, "actions", None)  # a policy-mode rollout's rows (online_batch.ActionRollout)
                rows = {} if generated is None else {"actions": executed_actions(self.condition.action, generated, self.config.model.action.execute)}
                by_name = self.score(rank, pixels.numpy(), texts, **rows)
                scores = [by_name[name] for name in names]
            except RewardUnavailable as exc:
                # Not raised here: the other ranks are about to wait in the gather. NaN (never a
                # score: the client admits finite numbers only) tells every rank at once.
                failures[rank], scores = str(exc), [[float("nan")] * len(texts) for _ in names]
            own.append(scores)
        return own, failures

    def _table_names(self) -> list[str]:
        """The rows of a rank's score table: each reward's, then each dimension's."""
        return [*sorted(self.reward_weights), *self.dimension_names]

    def _gather_scores(self, own: list[list[list[float]]], failures: dict[int, str]) -> dict[str, torch.Tensor] | None:
        names = self._table_names()
        everyone = self.comm.gather([torch.tensor(s, dtype=torch.float64, device=self.device) for s in own]).cpu()  # [G, rewards, rows]
        if torch.isnan(everyone).any():
            if failures:
                raise RewardUnavailable(next(iter(failures.values())))
            return None
        return {name: everyone[:, k, :].T for k, name in enumerate(names)}  # each [rows, G]


def _scored_by(client) -> ScoreFn:
    from cosmos_rl.rewards.client import RewardServiceError

    def score(rank: int, pixels: np.ndarray, prompts: Sequence[str], actions: np.ndarray | None = None) -> dict[str, list[float]]:
        try:
            scores, dims = client.score_dimensions(pixels, prompts, actions=actions)
        except RewardServiceError as exc:
            raise RewardUnavailable(f"rank {rank}: {exc}") from None  # the message names the service
        return {**scores, **dims}

    # every rank's table has the same rows: the dimensions the services list, read once here
    try:
        score.dimensions = tuple(client.dimension_names())
    except RewardServiceError as exc:
        raise RewardUnavailable(f"reading the rewards' /info: {exc}") from None
    return score
