"""DPO and SFT with `grid.backend = "ray"`: the torchrun trainer (`trainers.dpo`, `trainers.sft`)
inside Ray actors.

One policy actor per rank (world = data_parallel_shard_degree) from `dist.ray_group.ActorGroup`,
which reserves the placement, forms the gloo/NCCL world and turns actor failures into RunFailed
naming the rank. Each actor runs `DPOTrainer.run()` (or `SFTTrainer.run()`) unchanged, so rank 0 writes metrics.jsonl and
every rank joins the DCP checkpoint exactly as under torchrun.

`grid.grouping = "per_role"` (DPO only): the data role (pair source + cursor) lives in its own actor
(`DPODataActor`, no placement bundle: it only indexes and decodes pairs). Each step every policy
actor asks it for `next_batch(step, rank)` and receives only its own pairs; the first ask of a
step advances the cursor, the others are answered from the cached split, so the ranks see the same
global order as a local PairCursor. The
checkpoint's `data_cursor` is the data actor's cursor, and a resume pushes it back there.

Preemption: a scheduler signals the driver only. The driver passes SIGTERM/SIGUSR1/SIGINT on as
SIGTERM to the actors on its own host (their pids are asked for at start-up), whose trainer then
finishes the step, commits a checkpoint and raises Preempted (exit 75), as under torchrun. Actors on
other hosts of a multi-node cluster are not reached: there the signal must come from the scheduler.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from rich.markup import escape

from cosmos_rl.config import schema
from cosmos_rl.dist.ray_group import CALL_SLACK_S, ActorGroup, RankActor

# How long a policy actor waits for its batch: the data actor only indexes an in-memory source.
DATA_TIMEOUT_S = 120.0


class DPODataActor:
    """The per_role data role: pair source + one global cursor, split per rank like PairCursor."""

    def __init__(self, config: schema.RunConfig, world_size: int):
        from cosmos_rl.data.cursor import PairCursor
        from cosmos_rl.trainers.dpo import build_source

        rl = config.rl
        self.world_size = world_size
        self.source = build_source(rl.data, config.model.image_size, config.job.seed, "rl.data")
        # world 1: the whole step's indices, which next_batch splits exactly as PairCursor does.
        self.cursor = PairCursor(len(self.source), rl.pairs_per_step, config.job.seed, 1, 0, shuffle=rl.data.shuffle)
        self._cached: tuple[int, list] | None = None

    def next_batch(self, step: int, rank: int) -> list:
        """Rank `rank`'s pairs of trainer step `step` (1-based); the step's split is cached for the other ranks."""
        if self._cached is None or self._cached[0] != step:
            indices = self.cursor.next_batch()
            share = len(indices) // self.world_size
            self._cached = (step, [indices[r * share : (r + 1) * share] for r in range(self.world_size)])
        return [self.source[i] for i in self._cached[1][rank]]

    def cursor_state(self) -> dict:
        return self.cursor.state_dict()

    def load_cursor(self, state: dict) -> None:
        self.cursor.load_state_dict(state)
        self._cached = None


def _per_role_trainer(data_actor, timeout_s: float):
    """A DPOTrainer whose pairs come from the data actor (built lazily: torch imports stay in the actor)."""
    import ray

    from cosmos_rl.checkpoint import PlainState, layout
    from cosmos_rl.errors import RunFailed
    from cosmos_rl.trainers.dpo import DPOTrainer

    def ask(rank: int, ref, what: str):
        # ActorGroup passes a RunFailed through as is, so the message names the asking rank itself.
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RunFailed(f"rank {rank}: the data actor gave no answer to {what} within {timeout_s:.0f} s") from None
        except ray.exceptions.RayActorError as exc:
            raise RunFailed(f"rank {rank}: the data actor died during {what}: {str(exc).splitlines()[0][:300]}") from None

    class PerRoleDPOTrainer(DPOTrainer):
        def next_pairs(self) -> list:
            return ask(self.rank, data_actor.next_batch.remote(self.step + 1, self.rank), "next_batch")

        def _components(self, *, with_rng: bool = True):
            components = super()._components(with_rng=with_rng)
            if layout.DATA_CURSOR in components:  # the data actor's cursor, not this rank's unused one
                components[layout.DATA_CURSOR] = PlainState(ask(self.rank, data_actor.cursor_state.remote(), "cursor_state"))
            return components

        def _load_latest(self) -> None:
            super()._load_latest()  # loads the saved cursor into self.cursor
            if self.rl.data.cursor_resume:
                ask(self.rank, data_actor.load_cursor.remote(self.cursor.state_dict()), "load_cursor")

    return PerRoleDPOTrainer


class DPORayWorker(RankActor):
    """One rank. The driver calls pick_port (rank 0), setup_world, then train."""

    def __init__(self, rank: int, world_size: int, config: schema.RunConfig, run_dir: str, data_actor=None):
        self._init_rank(rank, world_size, config)
        self.run_dir, self.data_actor = Path(run_dir), data_actor

    def train(self, resume: bool) -> int:
        """Run the trainer to rl.max_steps; returns the last step."""
        from cosmos_rl.trainers.dpo import DPOTrainer
        from cosmos_rl.trainers.spmd_worker import _setup_logging
        from cosmos_rl.trainers.sft import SFTTrainer

        _setup_logging(self.run_dir, self.rank)
        if isinstance(self.config.rl, schema.SFTConfig):
            cls = SFTTrainer
        else:
            cls = DPOTrainer if self.data_actor is None else _per_role_trainer(self.data_actor, DATA_TIMEOUT_S)
        trainer = cls(self.config, self.run_dir, self.device, resume=resume)
        trainer.run()
        return trainer.step

    def host_pid(self) -> tuple[str, int]:
        import os

        return socket.gethostname(), os.getpid()

    def shutdown(self) -> None:
        from cosmos_rl.dist.world import process_group_active

        if process_group_active():
            import torch.distributed as dist

            dist.destroy_process_group()


class _forward_stop_signals:
    """While training, turn the driver's stop signals into SIGTERM for the local actors (their StopFlag)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, pids: list[int]):
        self.pids, self.previous = pids, {}

    def _forward(self, signum, frame) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:  # that actor already ended; the others still need the signal
                pass

    def __enter__(self):
        self.previous = {sig: signal.signal(sig, self._forward) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def start(config: schema.RunConfig, run_dir: Path, resume: bool, console) -> int:
    from cosmos_rl import plan

    world, _ = plan.world_size(config)
    group = ActorGroup(config.grid, world, DPORayWorker)
    data_actor = None
    try:
        t0 = time.perf_counter()
        group.cluster.connect()  # the data actor must exist before the group's init args are fixed
        if config.grid.grouping == "per_role":
            import ray

            # num_cpus=0: outside the policy placement, so it never competes with a rank for a bundle.
            data_actor = ray.remote(DPODataActor).options(num_cpus=0, max_restarts=0).remote(config, world)
        group.init_args = (config, str(run_dir), data_actor)
        group.start()
        group.write_placement(run_dir)  # where each rank landed: rank -> node id / node ip
        name = config.rl.algorithm
        console.print(f"[bold]{name}[/]: {escape(group.placement_summary())}", highlight=False, soft_wrap=True)
        console.print(
            f"[bold]{name}[/]: {world} Ray actors ({config.grid.grouping}) ready in {time.perf_counter() - t0:.1f} s",
            highlight=False,
        )
        here = socket.gethostname()
        local_pids = [pid for host, pid in group.call_all("host_pid", timeout_s=CALL_SLACK_S) if host == here]
        # One call spans the whole run: allow each remaining step the collective timeout.
        budget = config.rl.max_steps * config.grid.timeout_s + CALL_SLACK_S
        with _forward_stop_signals(local_pids):
            group.call_all("train", resume, timeout_s=budget)
        group.call_all("shutdown", timeout_s=CALL_SLACK_S)
        return 0
    finally:
        if data_actor is not None:  # before group.shutdown, which may stop the cluster it started
            import ray

            ray.kill(data_actor, no_restart=True)
        group.shutdown()
