"""The calls every rank trainer answers: all a launcher needs, for every algorithm and backend.

An algorithm's registry entry (`config/algorithms.py`) names its rank trainer class. A launcher
builds one per rank and drives it:

- under torchrun (`trainers/spmd_worker.py`, launcher kind "ranks"), every rank runs the step loop
  (`trainers.loop.run_rank_steps`) over these calls, so their collectives line up;
- on Ray (`trainers/ray_driver.py`, both kinds), the driver runs the loop and calls every actor's
  trainer, so a stop signal and every checkpoint reach every rank through Ray.

`trainers/spmd.SPMDTrainer` (DPO, SFT: each rank trains its share of the step's data) and
`trainers/online.OnlineTrainer` (NFT: rollouts scored by reward services) implement it; an
algorithm's trainer subclasses one of them and supplies its step's math.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from cosmos_rl.trainers.loop import Metrics



class RankTrainer(Protocol):
    step: int  # optimizer steps done: the start step once built (0, or the resumed checkpoint's)
    progress_fields: tuple[str, ...]  # the metrics the progress bar shows

    @classmethod
    def on_ray(cls, config, run_dir: Path, device, rank: int, world: int, resume: bool, context: dict) -> "RankTrainer":
        """Build (and on resume load) one rank of a Ray run; `context` is what the driver started for it."""

    def items_per_step(self) -> int:
        """What the progress bar counts per step (pairs, samples)."""

    def has_holdout(self) -> bool:
        """Whether `holdout` ever returns metrics (the driver skips the call otherwise)."""

    def train_step(self, step: int) -> Metrics:
        """Optimizer step `step` (= step + 1 of the last); the rank-reduced metrics, the same on every rank."""

    def holdout(self, step: int) -> Metrics:
        """The algorithm's own held-out pass on its steps (DPO's val/ metrics); {} on other steps."""

    def evaluate(self, step: int) -> Metrics:
        """`[rl.eval]`: the policy on the held-out prompts, the group's eval/ metrics."""

    def save(self, step: int):
        """Commit a checkpoint of `step` (collective)."""
