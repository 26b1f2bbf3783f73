"""The NFT driver: reward service, Ray actor group, the step loop, metrics and progress.

Order matters for "refuse before any worker starts": a resume's seed contract and the reward
service's revision pin are checked before Ray is touched. The built-in reward service runs on a
thread of this process on a free 127.0.0.1 port (the actors on this host reach it over loopback).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.markup import escape

from cosmos_rl.config import load, schema
from cosmos_rl.errors import Preempted, RunFailed, UserError

METRIC_NAMES = (
    "train/reward_mean", "train/reward_std", "train/policy_loss", "train/kl_loss", "train/advantage_mean",
    "train/optimality_mean", "train/optimality_second_moment", "train/positive_error", "train/negative_error",
    "time/rollout_s", "time/reward_s", "time/train_s", "time/orchestration_s",
)  # fmt: skip
PHASES = ("time/rollout_s", "time/reward_s", "time/train_s")


def _reward_token(reward: schema.RewardConfig) -> str | None:
    if not reward.token_env:
        return None
    token = os.environ.get(reward.token_env)
    if not token:
        raise UserError(f"rl.reward.token_env names {reward.token_env!r}, which is not set; export it or clear rl.reward.token_env")
    return token


def _resume_point(run_dir: Path) -> str:
    """Where a failed run continues from, for the one-line failure message."""
    from cosmos_rl.checkpoint import CheckpointManager

    try:
        step = CheckpointManager(run_dir, keep=0).latest_committed()
    except Exception:  # the message must not fail on an unreadable checkpoints folder
        step = None
    if step is None:
        return "no checkpoint was committed yet; start it again with `cosmos-rl train`"
    return (
        f"last committed checkpoint {run_dir / 'checkpoints' / f'step_{step}'}; "
        f"continue with `cosmos-rl resume {run_dir} --exact`"
    )


def _stop_flag():
    """SIGTERM/SIGUSR1: finish the step, commit, exit 75; a second signal aborts (cosmos_rl.preempt)."""
    from cosmos_rl.preempt import StopFlag

    flag = StopFlag()
    try:
        flag.install()
    except ValueError:  # not the main thread (e.g. a test thread): no requeue support
        pass
    return flag


def start(config: schema.RunConfig, run_dir: Path, resume: bool, exact: bool, console) -> int:
    from cosmos_rl.checkpoint import checkpoint_due
    from cosmos_rl.metrics import MetricsWriter, Progress
    from cosmos_rl.rewards.client import RewardClient
    from cosmos_rl.rewards.server import RewardServer

    rl = config.rl
    run_dir = Path(run_dir)
    server = group = writer = progress = None
    try:
        if resume:
            from cosmos_rl.trainers.nft_state import check_seed_contract

            check_seed_contract(config, run_dir)  # before the service, Ray, or any cursor
        url = rl.reward.url
        if not url:
            server = RewardServer("127.0.0.1", 0, revision=rl.reward.revision or None)
            url = server.start()
        RewardClient(
            url, rl.reward.name, rl.reward.revision, rl.reward.timeout_s, rl.reward.max_retries,
            rl.reward.backoff_s, _reward_token(rl.reward),
        ).check_revision()

        from cosmos_rl.dist.ray_group import ActorGroup
        from cosmos_rl.trainers.nft import NFTWorker

        group = ActorGroup(config.grid, rl.group_size, NFTWorker, (config, str(run_dir), url))
        t0 = time.perf_counter()
        group.start()
        group.write_placement(run_dir)  # where each rank landed: rank -> node id / node ip
        console.print(f"[bold]nft[/]: {escape(group.placement_summary())}", highlight=False, soft_wrap=True)  # one line in logs
        start_step = group.call_all("build", resume)[0]
        console.print(
            f"[bold]nft[/]: {rl.group_size} actors ready in {time.perf_counter() - t0:.1f} s; "
            f"{'resuming after' if resume else 'starting at'} step {start_step}, reward service {escape(url)}",
            highlight=False,
        )
        writer = MetricsWriter.for_job(
            config.job, run_dir, enabled=True, resume_step=start_step if resume else None,
            run_config=load.flatten(load.to_dict(config)),
        )
        progress = Progress(
            enabled=config.job.progress, total=rl.max_steps, start=start_step, unit="samples",
            fields=("train/reward_mean", "train/policy_loss"),
        )
        stop = _stop_flag()
        try:
            for step in range(start_step + 1, rl.max_steps + 1):
                began = time.perf_counter()
                try:
                    metrics = group.call_all("train_step", step)[0]
                except RunFailed as exc:
                    raise RunFailed(f"step {step}: {exc}; {_resume_point(run_dir)}") from None
                wall = time.perf_counter() - began
                # What the actors did not spend in their three phases: Ray calls, gathers, grids, stragglers.
                metrics["time/orchestration_s"] = max(0.0, wall - sum(metrics[k] for k in PHASES))
                if step % config.job.log_every == 0 or step == rl.max_steps:
                    writer.write(step, metrics)
                progress.update(step, metrics, items=rl.group_size * rl.prompts_per_step)
                if checkpoint_due(step, rl.max_steps, config.checkpoint.every) or stop.signalled:
                    try:
                        group.call_all("save", step)
                    except RunFailed as exc:
                        raise RunFailed(f"checkpoint of step {step}: {exc}; {_resume_point(run_dir)}") from None
                if stop.signalled and step < rl.max_steps:
                    raise Preempted(
                        f"stopped by {stop.signalled} after committing step {step}; "
                        f"continue with `cosmos-rl resume {run_dir} --exact`"
                    )
        finally:
            stop.uninstall()
        return 0
    finally:
        if progress is not None:
            progress.close()
        if writer is not None:
            writer.close()
        if group is not None:
            group.shutdown()
        if server is not None:
            server.stop()
