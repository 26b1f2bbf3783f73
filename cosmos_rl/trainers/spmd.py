"""The rank trainer of an algorithm whose ranks each train their share of a step's data (DPO, SFT).

It answers the calls of every rank trainer (`trainers/rank.py`). Under torchrun every rank runs
`trainers.loop.run_rank_steps` over them (`run()`); on Ray the driver runs the loop and calls every
actor's trainer (`trainers/ray_driver.py`).

This base holds what DPO and SFT share: the rank's place in the world, the optimizer, the
checkpoint manager and components, resume (a non-exact resume may change the world size: DCP
reshards, the RNG streams are then fresh), the metric mean over ranks and `[rl.eval]`. A subclass
builds its data and model in `setup()` and sets `module` (what the `policy` component saves),
`params` (what the optimizer steps) and `lora`.

Context parallelism (`grid.context_parallel` = N > 1, an algorithm whose registry entry says it
runs it: DPO, SFT): the world is data-parallel x N, consecutive N ranks one context group
(`dist.context_parallel.data_context_layout`) that trains the same data. `data_rank`/`data_world`
are then this rank's data-parallel rank and their count (otherwise `rank`/`world`): the data
cursor, the noise draws and the validation and `[rl.eval]` shares go by them, and a sum over the
world counts only each group's first rank (`_all_sum`). FSDP2 still shards over the whole world.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cosmos_rl.planning import plan
from cosmos_rl.checkpoint import CheckpointManager, LRScheduleState, OptimizerState, PlainState, RngStreams, layout
from cosmos_rl.checkpoint.policy import policy_component
from cosmos_rl.core import schema
from cosmos_rl.dist.world import process_group_active, rank_and_world
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.models.setup import build_optimizer
from cosmos_rl.trainers.loop import Metrics



class SPMDTrainer:
    """One rank's share of a data-parallel run; see the module docstring for the calls."""

    unit = "samples"  # what the progress bar counts
    progress_fields: tuple[str, ...] = ("train/loss",)
    # Checkpoints from before the algorithm was recorded in meta.json count as this algorithm's.
    unmarked_ok = False

    def __init__(self, config: schema.RunConfig, run_dir: Path, device: torch.device, *, resume: bool = False):
        self.config, self.rl = config, config.rl
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device, self.resume = device, resume
        self.distributed = process_group_active()
        self.rank, self.world = rank_and_world()
        self.is_main = self.rank == 0
        self.cp = None  # dist.context_parallel.ContextParallel of this rank's context group, or None
        self.data_rank, self.data_world = self.rank, self.world
        if config.grid.context_parallel > 1:
            from cosmos_rl.dist.context_parallel import data_context_layout

            layout = data_context_layout(config.grid.context_parallel, device.type)
            self.cp, self.data_rank, self.data_world = layout.cp, layout.dp_rank, layout.dp_size
        self.step = 0  # optimizer steps completed
        self.evaluator = None
        self.media = MediaSpec.from_model_config(config.model)
        self.setup()
        self.optimizer, self.schedule = build_optimizer(self.params, self.rl.optimizer)
        self.identity = plan.run_identity(config)
        self.checkpoints = CheckpointManager(
            self.run_dir, config.checkpoint.keep, run_identity=self.identity, algorithm=config.rl.algorithm
        )
        if resume:
            self._load_latest()

    @classmethod
    def on_ray(cls, config, run_dir: Path, device, rank: int, world: int, resume: bool, context: dict):
        """One rank of a Ray run (the process group is already formed: rank and world come from it)."""
        return cls(config, run_dir, device, resume=resume)

    def has_holdout(self) -> bool:
        return False

    # ---------------------------------------------------------------- what a subclass provides
    module: torch.nn.Module  # saved as the `policy` component
    params: list  # trained by the optimizer
    lora: bool  # the policy component holds only the trainable (adapter) tensors

    def setup(self) -> None:
        """Data, model, evaluator and cursor, in the order their draws and checks must happen."""
        raise NotImplementedError

    def train_step(self, step: int) -> Metrics:
        raise NotImplementedError

    def items_per_step(self) -> int:
        raise NotImplementedError

    def sampling_transformer(self) -> torch.nn.Module:
        """The network `[rl.eval]` samples with."""
        raise NotImplementedError

    def cursor_state(self) -> PlainState | None:
        """The data cursor's component (None: not resumed)."""
        return PlainState(self.cursor.state_dict())

    def restore_cursor(self, components: dict[str, Any]) -> None:
        self.cursor.load_state_dict(components[layout.DATA_CURSOR].data)

    # ---------------------------------------------------------------- state
    def _components(self, *, with_rng: bool = True) -> dict[str, Any]:
        components: dict[str, Any] = {
            layout.POLICY: policy_component(self.module, lora=self.lora),
            layout.OPTIMIZER: OptimizerState(self.module, self.optimizer),
            layout.LR_SCHEDULE: LRScheduleState(self.schedule),
            layout.PROGRESS: PlainState({"step": self.step}),
        }
        cursor = self.cursor_state()
        if cursor is not None:
            components[layout.DATA_CURSOR] = cursor
        if with_rng:
            components[layout.RNG] = RngStreams()
        return components

    def _load_latest(self) -> None:
        """Continue from the newest loadable committed checkpoint, or fail saying why (never restart from base).

        `CheckpointManager.resume_latest` skips (with a warning naming why) a committed checkpoint
        that cannot be loaded and tries the next older one; when none loads, the run stops listing
        every reason.
        """
        self.step, components = self.checkpoints.resume_for_world(
            self.world, lambda same_world: self._components(with_rng=same_world), unmarked_ok=self.unmarked_ok
        )
        if layout.DATA_CURSOR in components:
            self.restore_cursor(components)

    def save(self, step: int) -> Path:
        assert step == self.step, f"asked to save step {step} at step {self.step}"
        return self.checkpoints.save(self.step, self._components())

    # ---------------------------------------------------------------- collectives
    def _all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the ranks, on the CPU. The collective runs on the rank's device:
        NCCL takes only CUDA tensors (gloo reduces a CPU tensor in place, the same numbers)."""
        if not self.distributed:
            return values
        on_device = values.to(self.device)
        if self.cp is not None and self.cp.rank:
            # A context group's ranks hold one share's numbers: only its first rank's are summed.
            on_device = torch.zeros_like(on_device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.cpu()

    def _all_mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean over data-parallel ranks (every rank with context parallelism off)."""
        return self._all_sum(values) / self.data_world if self.distributed else values

    def set_context_parallel(self, *networks) -> None:
        """Run every packed forward of `networks` (the trained transformer, a frozen reference)
        over this rank's context group; nothing when context parallelism is off."""
        from cosmos_rl.models.packing import set_context_parallel

        for network in networks:
            if self.cp is not None and network is not None:
                set_context_parallel(network, self.cp)

    # ---------------------------------------------------------------- loop
    def _next(self, step: int) -> None:
        assert step == self.step + 1, f"the loop asked for step {step} after step {self.step}"

    def holdout(self, step: int) -> Metrics:
        return {}

    def evaluate(self, step: int) -> Metrics:
        """[rl.eval] (collective): every rank samples its share of the items, one all-reduce sums the scores."""
        from cosmos_rl.evaluation.evaluator import evaluate_all_reduce

        return evaluate_all_reduce(self.evaluator, self.sampling_transformer(), self.data_rank, self.data_world,
                                   counted=self.cp is None or self.cp.rank == 0)

    def run(self) -> list[Metrics]:
        """Train to rl.max_steps in this rank (torchrun, tests), writing metrics and checkpoints;
        returns the rows this call wrote."""
        from cosmos_rl.trainers.loop import LoopSpec, run_rank_steps

        spec = LoopSpec(
            run_dir=self.run_dir, start_step=self.step, resumed=self.resume, main=self.is_main,
            unit=self.unit, items_per_step=self.items_per_step(), progress_fields=self.progress_fields,
        )
        return run_rank_steps(self.config, spec, self.train_step, self.save, self.holdout, self.evaluate)
