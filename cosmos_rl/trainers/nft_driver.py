"""The NFT driver: reward services, Ray actor group, the step loop, metrics and progress.

Order matters for "refuse before any worker starts": a resume's seed contract and the reward
services' revision pins are checked before Ray is touched. Each built-in reward service runs on a
thread of this process on a free 127.0.0.1 port (the actors on this host reach it over loopback).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from cosmos_rl.config import schema
from cosmos_rl.errors import Preempted, RewardUnavailable, RunFailed

METRIC_NAMES = (
    "train/reward_mean", "train/reward_std", "train/policy_loss", "train/kl_loss", "train/advantage_mean",
    "train/optimality_mean", "train/optimality_second_moment", "train/positive_error", "train/negative_error",
    "time/rollout_s", "time/reward_s", "time/train_s", "time/orchestration_s",
)  # fmt: skip
PHASES = ("time/rollout_s", "time/reward_s", "time/train_s")


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
    from cosmos_rl.preempt import StopFlag
    from cosmos_rl.rewards.multi import start_reward_services
    from cosmos_rl.trainers.loop import LoopSpec, run_steps

    rl = config.rl
    run_dir = Path(run_dir)
    services = group = None
    # Actors never see a scheduler's signal: the driver's flag decides (from the very start, so a
    # stop while Ray and the actors start is honoured too), and save_fn reaches every rank.
    stop = StopFlag().install_if_main_thread()
    try:
        if resume:
            from cosmos_rl.trainers.nft_state import check_seed_contract

            check_seed_contract(config, run_dir)  # before the service, Ray, or any cursor
        # Tokens read once here (the actors get the values, not the variables' names); a built-in
        # loopback service for every reward without a url; every pin checked before Ray starts.
        services = start_reward_services(rl)
        services.check_revisions()
        url = ", ".join(f"{name} {escape(u)}" for name, u in services.urls.items())

        from cosmos_rl.dist.ray_group import ActorGroup
        from cosmos_rl.trainers.nft import NFTWorker

        group = ActorGroup(config.grid, rl.group_size, NFTWorker, (config, str(run_dir), services.urls, services.tokens))
        t0 = time.perf_counter()
        group.start()
        stop.install_if_main_thread()  # again: starting Ray put its own SIGTERM handler (abort) in place
        group.write_placement(run_dir)  # where each rank landed: rank -> node id / node ip
        console.print(f"[bold]nft[/]: {escape(group.placement_summary())}", highlight=False, soft_wrap=True)  # one line in logs
        start_step = group.call_all("build", resume)[0]
        console.print(
            f"[bold]nft[/]: {rl.group_size} actors ready in {time.perf_counter() - t0:.1f} s; "
            f"{'resuming after' if resume else 'starting at'} step {start_step}, reward service {url}",
            highlight=False,
        )

        def step_fn(step: int) -> dict[str, float]:
            began = time.perf_counter()
            try:
                metrics = group.call_all("train_step", step)[0]
            except RewardUnavailable as exc:
                # The step trained nothing; commit the one before, so the outage loses no finished work.
                if step - 1 > 0 and not (run_dir / "checkpoints" / f"step_{step - 1}").is_dir():
                    save_fn(step - 1)
                raise RunFailed(f"step {step}: {exc}; {_resume_point(run_dir)}") from None
            except RunFailed as exc:
                raise RunFailed(f"step {step}: {exc}; {_resume_point(run_dir)}") from None
            # What the actors did not spend in their three phases: Ray calls, gathers, grids, stragglers.
            metrics["time/orchestration_s"] = max(0.0, time.perf_counter() - began - sum(metrics[k] for k in PHASES))
            return metrics

        def save_fn(step: int) -> None:
            try:
                group.call_all("save", step)
            except RunFailed as exc:
                raise RunFailed(f"checkpoint of step {step}: {exc}; {_resume_point(run_dir)}") from None

        def evaluate(step: int) -> dict[str, float]:
            try:
                return group.call_all("evaluate", step)[0]
            except RunFailed as exc:
                raise RunFailed(f"evaluation after step {step}: {exc}; {_resume_point(run_dir)}") from None

        spec = LoopSpec(
            run_dir=run_dir, start_step=start_step, resumed=resume, main=True, unit="samples",
            items_per_step=rl.group_size * rl.prompts_per_step,
            progress_fields=("train/reward_mean", "train/policy_loss"),
        )
        if stop.signalled:
            # Stopped while starting: nothing was trained, so nothing is lost; `resume` starts over.
            raise Preempted(
                f"stopped by {stop.signalled} before step {start_step + 1}; nothing was lost: "
                f"continue with `cosmos-rl resume {run_dir}`"
            )
        from cosmos_rl.evaluation.during import with_eval

        step_fn, holdout_fn = with_eval(config, step_fn, None, evaluate, main=True, console=console)
        run_steps(config, spec, step_fn, save_fn, lambda: stop.signalled, holdout_fn, stop_committed=stop.mark_committed)
        return 0
    finally:
        stop.uninstall()
        if group is not None:
            group.shutdown()
        if services is not None:
            services.stop()
