"""The NFT driver: reward service, Ray actor group, the step loop, metrics and progress.

Order matters for "refuse before any worker starts": a resume's seed contract and the reward
service's revision pin are checked before Ray is touched. The built-in reward service runs on a
thread of this process on a free 127.0.0.1 port (the actors on this host reach it over loopback).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cosmos_rl.config import schema
from cosmos_rl.errors import Preempted, UserError

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


def _checkpoint_due(config: schema.RunConfig, step: int) -> bool:
    every = config.checkpoint.every
    return step == config.rl.max_steps or (every > 0 and step % every == 0)


class _StopSignal:
    """SIGTERM/SIGUSR1 ask the loop to checkpoint after the current step and exit 75 (requeue)."""

    def __init__(self):
        self.raised: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. called from a test thread): no requeue support
                pass
        return self

    def _handle(self, signum, frame):
        self.raised = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def start(config: schema.RunConfig, run_dir: Path, resume: bool, exact: bool, console) -> int:
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
        start_step = group.call_all("build", resume)[0]
        console.print(
            f"[bold]nft[/]: {rl.group_size} actors ready in {time.perf_counter() - t0:.1f} s; "
            f"{'resuming after' if resume else 'starting at'} step {start_step}, reward service {url}",
            highlight=False,
        )
        writer = MetricsWriter(
            run_dir, enabled=True, tensorboard=config.job.tensorboard, resume_step=start_step if resume else None
        )
        progress = Progress(
            enabled=config.job.progress, total=rl.max_steps, start=start_step, unit="samples",
            fields=("train/reward_mean", "train/policy_loss"),
        )
        with _StopSignal() as stop:
            for step in range(start_step + 1, rl.max_steps + 1):
                began = time.perf_counter()
                metrics = group.call_all("train_step", step)[0]
                wall = time.perf_counter() - began
                # What the actors did not spend in their three phases: Ray calls, gathers, grids, stragglers.
                metrics["time/orchestration_s"] = max(0.0, wall - sum(metrics[k] for k in PHASES))
                if step % config.job.log_every == 0 or step == rl.max_steps:
                    writer.write(step, metrics)
                progress.update(step, metrics, items=rl.group_size * rl.prompts_per_step)
                if _checkpoint_due(config, step) or stop.raised:
                    group.call_all("save", step)
                if stop.raised and step < rl.max_steps:
                    raise Preempted(f"stopped by {stop.raised} after committing step {step}; resume with --exact")
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
