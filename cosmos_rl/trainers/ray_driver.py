"""Every algorithm on Ray (`grid.backend = "ray"`): this process is the driver and runs the step loop.

One `RankWorker` actor per rank (`dist.ray_group.ActorGroup` reserves the placement, forms the
gloo/NCCL world and turns actor failures into RunFailed naming the rank) holds the algorithm's
rank trainer (`trainers/rank.py`). The driver runs `trainers.loop.run_steps` and each step calls
every actor: `train_step`, then `holdout`, `evaluate` and `save` on their steps. Every rank
returns the same (rank-reduced) metrics; rank 0's are the row.

A stop signal reaches the driver's flag (`preempt.StopFlag`), which the loop reads after every
step; the checkpoint it then commits is a call on every actor, so a stop reaches every rank on
every node through Ray. The actors never act on a signal themselves.

Online algorithms (registry launcher "driver": NFT) also need the reward services: a resume's seed
contract and the services' revision pins are checked before Ray is touched, a built-in service
runs on a thread of this process on a free 127.0.0.1 port, and a reward outage commits the step
before the one that failed. Data-parallel algorithms (launcher "ranks") may place DPO's data role
in its own actor (`grid.grouping = "per_role"`, `trainers/dpo_data_actor.py`).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.dist.ray_group import CALL_SLACK_S, RankActor
from cosmos_rl.core.errors import Preempted, RewardUnavailable, RunFailed

# The online step's phases: what the driver adds up to report its own share (time/orchestration_s).
PHASES = ("time/rollout_s", "time/reward_s", "time/train_s")


class RankWorker(RankActor):
    """The Ray actor of one rank: builds the run's rank trainer and answers the driver's calls
    (`pick_port` on rank 0 and `setup_world` on all form the process group first: RankActor)."""

    def __init__(self, rank: int, world_size: int, config: schema.RunConfig, run_dir: str, context: dict):
        self._init_rank(rank, world_size, config)
        self.run_dir, self.context = Path(run_dir), context

    def build(self, resume: bool) -> dict:
        """Build (and on resume load) the trainer; returns what the driver's loop needs of it."""
        from cosmos_rl.trainers.spmd_worker import _setup_logging

        _setup_logging(self.run_dir, self.rank)
        trainer_cls = algorithms.of(self.config).resolve("trainer")
        self.trainer = trainer_cls.on_ray(self.config, self.run_dir, self.device, self.rank, self.world_size, resume, self.context)
        return {
            "step": self.trainer.step, "holdout": self.trainer.has_holdout(),
            "items_per_step": self.trainer.items_per_step(), "progress_fields": tuple(self.trainer.progress_fields),
        }  # fmt: skip

    def train_step(self, step: int) -> dict[str, float]:
        return self.trainer.train_step(step)

    def holdout(self, step: int) -> dict[str, float]:
        return self.trainer.holdout(step)

    def evaluate(self, step: int) -> dict[str, float]:
        return self.trainer.evaluate(step)

    def save(self, step: int) -> str:
        return str(self.trainer.save(step))

    def shutdown(self) -> None:
        from cosmos_rl.dist.world import process_group_active
        from cosmos_rl.trainers.online import OnlineTrainer

        if isinstance(getattr(self, "trainer", None), OnlineTrainer):  # none when build failed; DPO's has no scoring thread
            self.trainer.close()  # rl.async_reward: its scoring thread ends before the process group

        if process_group_active():
            import torch.distributed as dist

            dist.destroy_process_group()


def _resume_point(run_dir: Path) -> str:
    """Where a failed run continues from, for the one-line failure message."""
    from cosmos_rl.checkpoint import layout

    try:
        step = layout.latest_committed(layout.checkpoints_root(run_dir))
    except Exception:  # the message must not fail on an unreadable checkpoints folder
        step = None
    if step is None:
        return "no checkpoint was committed yet; start it again with `cosmos-rl train`"
    return (
        f"last committed checkpoint {run_dir / 'checkpoints' / f'step_{step}'}; "
        f"continue with `cosmos-rl resume {run_dir} --exact`"
    )


def start(config: schema.RunConfig, run_dir: Path, resume: bool, console) -> int:
    from cosmos_rl.planning import plan
    from cosmos_rl.dist.ray_group import ActorGroup
    from cosmos_rl.dist.preempt import StopFlag
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    entry = algorithms.of(config)
    online = entry.launcher == "driver"
    run_dir = Path(run_dir)
    world, _ = plan.world_size(config)
    services = group = data_actor = None
    # The driver's flag decides, from the very start (a stop while Ray and the actors start is
    # honoured too), and save_fn reaches every rank.
    stop = StopFlag().install_if_main_thread()
    try:
        context: dict = {}
        if online:
            services, context = _start_services(config, run_dir, resume)
        # DPO's per_role data actor takes one of the local cluster's warm workers before the ranks do.
        group = ActorGroup(config.grid, world, RankWorker, spare_workers=int(config.grid.grouping == "per_role"))
        t0 = time.perf_counter()
        group.cluster.connect()  # DPO's data actor must exist before the group's init args are fixed
        if config.grid.grouping == "per_role":  # DPO only (preflight)
            from cosmos_rl.trainers.dpo_data_actor import start_data_actor

            data_actor = context["data_actor"] = start_data_actor(config, world)
        group.init_args = (config, str(run_dir), context)
        group.start()
        stop.install_if_main_thread()  # again: starting Ray put its own SIGTERM handler (abort) in place
        group.write_placement(run_dir)  # where each rank landed: rank -> node id / node ip
        name = config.rl.algorithm
        console.print(f"[bold]{escape(name)}[/]: {escape(group.placement_summary())}", highlight=False, soft_wrap=True)
        built = group.call_all("build", resume)[0]
        start_step = built["step"]
        if online:
            url = ", ".join(f"{reward} {escape(u)}" for reward, u in services.urls.items())
            console.print(
                f"[bold]{escape(name)}[/]: {world} actors ready in {time.perf_counter() - t0:.1f} s; "
                f"{'resuming after' if resume else 'starting at'} step {start_step}, reward service {url}",
                highlight=False,
            )
        else:
            console.print(
                f"[bold]{escape(name)}[/]: {world} Ray actors ({config.grid.grouping}) ready in {time.perf_counter() - t0:.1f} s",
                highlight=False,
            )

        def step_fn(step: int) -> dict[str, float]:
            began = time.perf_counter()
            try:
                metrics = group.call_all("train_step", step)[0]
            except RewardUnavailable as exc:
                # The step trained nothing; commit the one before, so the outage loses no finished work.
                # (rl.async_reward: each rank has put back its cursor, and the failed step's rollout is its pending one.)
                if step - 1 > 0 and not (run_dir / "checkpoints" / f"step_{step - 1}").is_dir():
                    save_fn(step - 1)
                raise RunFailed(f"step {step}: {exc}; {_resume_point(run_dir)}") from None
            except RunFailed as exc:
                raise RunFailed(f"step {step}: {exc}; {_resume_point(run_dir)}") from None
            if all(k in metrics for k in PHASES):
                # What the actors did not spend in their three phases: Ray calls, gathers, grids, stragglers.
                metrics["time/orchestration_s"] = max(0.0, time.perf_counter() - began - sum(metrics[k] for k in PHASES))
            return metrics

        def save_fn(step: int) -> None:
            try:
                group.call_all("save", step)
            except RunFailed as exc:
                raise RunFailed(f"checkpoint of step {step}: {exc}; {_resume_point(run_dir)}") from None

        def holdout_fn(step: int) -> dict[str, float]:
            try:
                return group.call_all("holdout", step)[0]
            except RunFailed as exc:
                raise RunFailed(f"held-out pass after step {step}: {exc}; {_resume_point(run_dir)}") from None

        def evaluate(step: int) -> dict[str, float]:
            try:
                return group.call_all("evaluate", step)[0]
            except RunFailed as exc:
                raise RunFailed(f"evaluation after step {step}: {exc}; {_resume_point(run_dir)}") from None

        spec = LoopSpec(
            run_dir=run_dir, start_step=start_step, resumed=resume, main=True, unit=entry.unit,
            items_per_step=built["items_per_step"], progress_fields=built["progress_fields"],
        )
        if stop.signalled:
            # Stopped while starting: nothing was trained, so nothing is lost; `resume` starts over.
            raise Preempted(
                f"stopped by {stop.signalled} before step {start_step + 1}; nothing was lost: "
                f"continue with `cosmos-rl resume {run_dir}`"
            )
        from cosmos_rl.evaluation.during import with_eval

        step_fn, holdout, halt = with_eval(config, step_fn, holdout_fn if built["holdout"] else None, evaluate, main=True, console=console)
        run_steps(config, spec, step_fn, save_fn, lambda: stop.signalled, holdout, stop_committed=stop.mark_committed, halt=halt)
        group.call_all("shutdown", timeout_s=CALL_SLACK_S)
        return 0
    finally:
        stop.uninstall()
        if data_actor is not None:  # before group.shutdown, which may stop the cluster it started
            import ray

            ray.kill(data_actor, no_restart=True)
        if group is not None:
            group.shutdown()
        if services is not None:
            services.stop()


def _start_services(config: schema.RunConfig, run_dir: Path, resume: bool):
    """(the reward services, what the actors need of them): an online run's seed contract is
    checked first, then every reward's service is started or reached and its pins checked."""
    from cosmos_rl.rewards.multi import start_reward_services

    if resume:
        from cosmos_rl.trainers.online_state import check_seed_contract

        check_seed_contract(config, run_dir)  # before the service, Ray, or any cursor
    # Tokens read once here (the actors get the values, not the variables' names); a built-in
    # loopback service for every reward without a url; every pin checked before Ray starts.
    services = start_reward_services(config.rl)
    try:
        # a video run's rewards must take clips (a clip reward, or an image reward frame by frame)
        from cosmos_rl.core.media import MediaSpec

        services.check_revisions(MediaSpec.from_model_config(config.model))
    except BaseException:
        services.stop()
        raise
    return services, {"reward_urls": services.urls, "reward_tokens": services.tokens}
