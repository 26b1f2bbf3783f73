"""Hand a validated run to its backend; heavy imports happen only here and below."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from rich.markup import escape

from cosmos_rl.planning import run_dir as run_mod
from cosmos_rl.core import run_lock
from cosmos_rl.core import schema


def train(config: schema.RunConfig, manifest: Path, console, summary=None) -> int:
    """Start a new run of `config` (already loaded with its overrides and preflighted); when it
    ends well, `summary(line)` gets the closing summary's lines (`commands.run_summary`)."""
    started = time.monotonic()
    config, run_dir = run_mod.pin_paths(config, manifest)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir, f"cosmos-rl train {manifest}", config):
        run_mod.prepare_new(config, run_dir)  # only under the lock: it truncates metrics.jsonl
        code = _backend(config).start(config, run_dir, resume=False, console=console)
    _summarize(summary, code, run_dir, config, time.monotonic() - started, 0)
    return code


def resume(run_dir: Path, overrides: list[str], exact: bool, console, summary=None) -> int:
    """Continue a run; `exact` is enforced here, by the resume rules, before any backend starts.
    A run whose every step is done and committed starts no backend: `summary` gets its summary."""
    started = time.monotonic()
    run_mod.check_run_dir(Path(run_dir))  # before the lock file is created inside it
    with _locked(Path(run_dir), f"cosmos-rl resume {run_dir}" + (" --exact" if exact else ""), _saved(run_dir)):
        code, config, first, idle = _resume_locked(Path(run_dir), overrides, exact, console)
    _summarize(summary, code, Path(run_dir), config, time.monotonic() - started, first, nothing_left=idle)
    return code


def _resume_locked(run_dir: Path, overrides: list[str], exact: bool, console) -> tuple[int, schema.RunConfig, int, bool]:
    """(exit code, the config resumed, the step it resumed after, whether nothing was left to train)."""
    from cosmos_rl.checkpoint import layout

    config, notices = run_mod.load_for_resume(run_dir, overrides, exact=exact)
    for notice in notices:
        console.print(f"[yellow]notice[/]: {escape(notice)}", highlight=False)  # notices quote paths
    done = run_mod.nothing_left(run_dir, config)
    if done is not None:
        return 0, config, done, True
    resumed = run_mod.has_committed_checkpoint(run_dir)
    first = layout.latest_committed(layout.checkpoints_root(run_dir)) or 0
    return _backend(config).start(config, Path(run_dir).resolve(), resume=resumed, console=console), config, first, False


def _summarize(summary, code: int, run_dir: Path, config: schema.RunConfig, seconds: float, first: int, *, nothing_left: bool = False) -> None:
    if summary is None or code:
        return
    from cosmos_rl.commands import run_summary

    for line in run_summary.lines(run_dir, config.rl.max_steps, seconds, first, nothing_left=nothing_left):
        summary(line)


def _saved(run_dir: Path) -> schema.RunConfig | None:
    """The run's saved config, for choosing how to lock; a broken one is reported by the resume rules."""
    from cosmos_rl.config import load

    try:
        return load.load(Path(run_dir) / run_mod.MANIFEST, saved_run=True)
    except Exception:  # noqa: BLE001 - load_for_resume names the problem right after
        return None


@contextlib.contextmanager
def _locked(run_dir: Path, command: str, config: schema.RunConfig | None = None):
    if config is not None and config.grid.backend == "local" and config.grid.nodes > 1:
        # Multi-node torchrun: the operator starts one `cosmos-rl train` per node on the shared
        # run directory by design, so the agents cannot exclude each other.
        yield
        return
    run_lock.acquire(run_dir, command)
    try:
        yield
    finally:
        run_lock.release(run_dir)


def _backend(config: schema.RunConfig):
    """On Ray this process drives every algorithm's actors; under torchrun the ranks run the loop
    (preflight allows torchrun only for an algorithm whose registry launcher kind is "ranks")."""
    if config.grid.backend == "ray":
        from cosmos_rl.trainers import ray_driver

        return ray_driver
    from cosmos_rl.trainers import spmd_launch

    return spmd_launch
