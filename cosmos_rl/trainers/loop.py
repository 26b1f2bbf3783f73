"""The step loop every trainer runs: steps, held-out passes, metrics, progress, checkpoints, preemption.

An algorithm supplies what one step does (`step_fn`), how a checkpoint is written (`save_fn`)
and, optionally, a held-out pass (`holdout_fn`, called after each step; it returns {} when the step
is not one of its steps). The loop owns the rest, the same way for every algorithm and backend:

- metrics: one `metrics.jsonl` row every `job.log_every` steps and at the last step, written by the
  main process only (sinks from `[job]`); a resumed run truncates rows past its checkpoint; a row's
  `time/*` seconds are the mean over the steps it covers (since the row before), every other key
  the logged step's own;
- progress: on the main process, the rich bar on a terminal, plain lines on stdout when it is not
  one (a log: one every `job.log_every` steps or `job.progress_every_s` seconds, core.metrics.Progress);
- a step whose `train/loss` or `train/grad_norm` is not finite stops the run (RunFailed);
- checkpoints at `checkpoint_due` steps, and before stopping on SIGTERM/SIGUSR1 (then `Preempted`)
  or on a reward-hacking warning with `rl.eval.stop_on_hacking` (`halt`; then `HackingStopped`).

Where the loop runs differs per backend and is the caller's business: DPO runs it in every rank
(collectives inside `step_fn`/`holdout_fn`/`save_fn` line up because every rank walks the same
steps; `stop_requested` is then collective too), NFT runs it in the Ray driver, whose `step_fn`
and `save_fn` call every actor.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import attrs

from cosmos_rl.checkpoint import checkpoint_due
from cosmos_rl.config import load
from cosmos_rl.core import schema
from cosmos_rl.core.errors import HackingStopped, Preempted, RunFailed

Metrics = dict[str, float]
FINITE_METRICS = ("train/loss", "train/grad_norm")


@attrs.frozen
class LoopSpec:
    """What the loop needs to know besides the config: where it starts and how it reports."""

    run_dir: Path
    start_step: int  # optimizer steps already done (0 for a new run)
    resumed: bool
    main: bool  # this process writes metrics and draws progress
    unit: str  # what the progress bar counts ("pairs", "samples")
    items_per_step: int
    progress_fields: tuple[str, ...]


def run_steps(
    config: schema.RunConfig,
    spec: LoopSpec,
    step_fn: Callable[[int], Metrics],
    save_fn: Callable[[int], object],
    stop_requested: Callable[[], str | None],
    holdout_fn: Callable[[int], Metrics] | None = None,
    stop_committed: Callable[[], None] = lambda: None,
    halt: Callable[[], str | None] = lambda: None,
) -> list[dict]:
    """Run steps `start_step + 1 .. rl.max_steps`; returns the rows this call wrote.

    `stop_requested()` returns the stop signal's name (or a truthy label) once a stop was asked
    for; it is called after every step but the last, on every process the loop runs in.
    `stop_committed()` is called once the stop's checkpoint is committed (a second signal is then
    harmless; see `preempt.StopFlag`). `halt()` returns the reward-hacking warning that stops the
    run (`evaluation.during`), read after every step, the last included, on every process.
    """
    from cosmos_rl.core.metrics import MetricsWriter, Progress

    job, max_steps = config.job, config.rl.max_steps
    writer = MetricsWriter.for_job(
        job, spec.run_dir, enabled=spec.main, resume_step=spec.start_step if spec.resumed else None,
        run_config=load.flatten(load.to_dict(config)),
    )
    progress = Progress(
        enabled=spec.main and job.progress, total=max_steps, start=spec.start_step, unit=spec.unit,
        fields=spec.progress_fields, every_steps=job.log_every, every_s=job.progress_every_s,
    )
    rows: list[dict] = []
    # Seconds per time/* key, summed over the steps since the last row, and how many steps had it: a
    # logged step can cost more than the ones between (online runs with rl.kl_beta = 0 measure their
    # KL only there), so the row stands for every step it covers, as `compare`'s wall-clock reads it.
    spent: dict[str, tuple[float, int]] = {}
    try:
        for step in range(spec.start_step + 1, max_steps + 1):
            metrics = step_fn(step)
            for key, seconds in metrics.items():
                if key.startswith("time/"):
                    total, count = spent.get(key, (0.0, 0))
                    spent[key] = (total + seconds, count + 1)
            bad = {k: metrics[k] for k in FINITE_METRICS if k in metrics and not math.isfinite(metrics[k])}
            if bad:
                raise RunFailed(f"step {step}: non-finite {bad}; lower the learning rate or check the data")
            if holdout_fn is not None:
                metrics.update(holdout_fn(step))
            last = step == max_steps
            if step % job.log_every == 0 or last:
                row = {**metrics, **{key: total / count for key, (total, count) in spent.items()}}
                spent = {}
                writer.write(step, row)
                rows.append({"step": step, **row})
            progress.update(step, metrics, spec.items_per_step)
            saved = checkpoint_due(step, max_steps, config.checkpoint.every)
            if saved:
                save_fn(step)
            halted = halt()
            if halted:
                if not saved:
                    save_fn(step)
                raise HackingStopped(
                    f"{halted}; rl.eval.stop_on_hacking stopped the run after committing step {step} "
                    f"({spec.run_dir / 'checkpoints' / f'step_{step}'}); look at the samples, then "
                    f"`cosmos-rl resume {spec.run_dir}` with rl.eval.stop_on_hacking = false to go on"
                )
            stop = None if last else stop_requested()
            if stop:
                if not saved:
                    save_fn(step)
                stop_committed()
                raise Preempted(
                    f"stopped by {stop} after committing step {step}; "
                    f"continue with `cosmos-rl resume {spec.run_dir} --exact`"
                )
    finally:
        progress.close()
        writer.close()
    return rows


def run_rank_steps(
    config: schema.RunConfig, spec: LoopSpec, step_fn: Callable[[int], Metrics], save_fn: Callable[[int], object],
    holdout_fn: Callable[[int], Metrics] | None, evaluate: Callable[[int], Metrics],
) -> list[dict]:  # fmt: skip
    """`run_steps` as each rank of a torchrun (or Ray-actor) world runs it, DPO's and SFT's: with
    `[rl.eval]` added (`evaluate(step)` is collective) and the SIGTERM/SIGUSR1 flag installed for
    the run's duration."""
    from cosmos_rl.evaluation.during import with_eval
    from cosmos_rl.dist.preempt import StopFlag

    step_fn, holdout_fn, halt = with_eval(config, step_fn, holdout_fn, evaluate, main=spec.main)
    stop = StopFlag().install()
    try:
        return run_steps(config, spec, step_fn, save_fn, stop.should_stop, holdout_fn, stop_committed=stop.mark_committed, halt=halt)
    finally:
        stop.uninstall()
