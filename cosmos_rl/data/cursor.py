"""Resumable, epoch-shuffled walks over a dataset's indices.

The walk is one endless stream: epoch ``e`` is ``torch.randperm(n)`` seeded with
``seed + e``, epochs are concatenated, and each step takes the next ``per_step``
positions. Nothing is dropped: a step that crosses an epoch boundary takes the tail of
one epoch and the head of the next (so, rarely, one index can occur twice in such a
step, and always when ``per_step > n``). The only state is the number of steps taken,
so a saved cursor resumes exactly where it stopped.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_rl.core.errors import UserError

_STATE_VERSION = 1


class ShuffledStream:
    """The endless stream of shuffled indices shared by the pair and prompt cursors."""

    def __init__(self, size: int, per_step: int, seed: int, shuffle: bool = True):
        if size <= 0:
            raise UserError(f"the data source is empty (0 rows); give it at least {per_step} rows")
        if per_step <= 0:
            raise ValueError(f"per_step must be positive, got {per_step}")
        self.size = size
        self.per_step = per_step
        self.seed = seed
        self.shuffle = shuffle  # False: every epoch walks the rows in file order
        self.step = 0
        self._epoch = -1
        self._order: list[int] = []

    def _epoch_order(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._order = torch.randperm(self.size, generator=generator).tolist()
            else:
                self._order = list(range(self.size))
            self._epoch = epoch
        return self._order

    def take(self) -> list[int]:
        """The global indices of the next step, advancing the stream."""
        start = self.step * self.per_step
        indices = []
        for position in range(start, start + self.per_step):
            epoch, offset = divmod(position, self.size)
            indices.append(self._epoch_order(epoch)[offset])
        self.step += 1
        return indices

    @property
    def epoch(self) -> int:
        """The epoch the next step starts in."""
        return (self.step * self.per_step) // self.size

    def state_dict(self) -> dict[str, int]:
        return {
            "version": _STATE_VERSION,
            "step": self.step,
            "seed": self.seed,
            "size": self.size,
            "per_step": self.per_step,
        }

    def load_state_dict(self, state: dict[str, Any], what: str) -> None:
        """Resume; refuses a state whose stream would differ (other data, seed or batch)."""
        if state.get("version") != _STATE_VERSION:
            raise UserError(
                f"{what}: checkpoint cursor has version {state.get('version')!r}, expected {_STATE_VERSION}"
            )
        for key, current in (("seed", self.seed), ("size", self.size), ("per_step", self.per_step)):
            if state.get(key) != current:
                raise UserError(
                    f"{what}: checkpoint cursor was saved with {key}={state.get(key)!r} but this run has "
                    f"{key}={current}; resuming would replay or skip rows - restore the original setting "
                    "or start a fresh run"
                )
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise UserError(f"{what}: checkpoint cursor has invalid step {step!r}")
        self.step = step


def check_divisible(pairs_per_step: int, world_size: int) -> None:
    """Each rank takes an equal contiguous share of a step's pairs, so the split must be exact."""
    if pairs_per_step <= 0 or world_size <= 0 or pairs_per_step % world_size:
        raise UserError(
            f"rl.pairs_per_step: {pairs_per_step} pairs cannot be split evenly over {world_size} ranks; "
            f"set it to a positive multiple of {world_size}"
        )


class PairCursor:
    """Which preference pairs this rank trains on at each step.

    A step's ``pairs_per_step`` global indices are split into ``world_size`` contiguous
    slices; rank ``r`` gets slice ``r``. The global order does not depend on
    ``world_size``, so a checkpoint can be resumed on a different number of ranks.
    """

    def __init__(
        self, source_len: int, pairs_per_step: int, seed: int, world_size: int, rank: int, *, shuffle: bool = True
    ):
        check_divisible(pairs_per_step, world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self._stream = ShuffledStream(source_len, pairs_per_step, seed, shuffle)
        self.world_size = world_size
        self.rank = rank

    @property
    def step(self) -> int:
        return self._stream.step

    @property
    def epoch(self) -> int:
        return self._stream.epoch

    def next_batch(self) -> list[int]:
        """This rank's source indices for the next step."""
        indices = self._stream.take()
        share = len(indices) // self.world_size
        return indices[self.rank * share : (self.rank + 1) * share]

    def state_dict(self) -> dict[str, int]:
        return self._stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state, "rl.data (preference cursor)")
