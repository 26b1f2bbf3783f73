"""The run directory: the resolved manifest a run was started with, and the resume rules.

``<job.output_dir>/<job.name>/`` holds ``manifest.toml`` (resolved, absolute paths),
``metrics.jsonl`` and ``checkpoints/``. ``resume`` reloads ``manifest.toml`` with overrides and
refuses identity changes (printing the diff); ``--exact`` also refuses any world-size change.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from cosmos_rl.planning import plan
from cosmos_rl.checkpoint import layout
from cosmos_rl.config import algorithms, load
from cosmos_rl.core import schema
from cosmos_rl.core.problems import ManifestError, Problem
from cosmos_rl.core.errors import UserError

MANIFEST = "manifest.toml"
METRICS = "metrics.jsonl"
CHECKPOINTS = layout.CHECKPOINTS

# Fields that decide the world size; a run whose algorithm reshards (DPO, SFT) may change them on a
# non-exact resume (DCP reshards).
WORLD_FIELDS = frozenset(
    {"model.config.parallelism.data_parallel_shard_degree", "grid.nodes", "grid.gpus_per_node"}
)


def has_committed_checkpoint(run_dir: Path) -> bool:
    return bool(layout.committed_steps(layout.checkpoints_root(run_dir)))


def pin_paths(config: schema.RunConfig, manifest_path: Path) -> tuple[schema.RunConfig, Path]:
    """The config with paths made absolute (relative to the manifest) and its run directory; no side effects."""
    config = load.with_absolute_paths(config, Path(manifest_path).resolve().parent)
    return config, plan.run_dir(config).resolve()


def prepare_new(config: schema.RunConfig, run_dir: Path) -> None:
    """Create the run directory and write the resolved manifest; refuse to reuse a run. `config`
    and `run_dir` come from `pin_paths`; the caller holds the run directory's lock."""
    if has_committed_checkpoint(run_dir):
        raise UserError(
            f"job.name: run directory {run_dir} already holds committed checkpoints; "
            f"continue it with `cosmos-rl resume {run_dir} --exact`, or choose another job.name"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS).unlink(missing_ok=True)
    (run_dir / MANIFEST).write_text(load.to_toml(config), encoding="utf-8")


def identity_diff(old: schema.RunConfig, new: schema.RunConfig) -> tuple[list[str], list[str]]:
    """(identity changes, other changes) as `key: old -> new` lines."""
    before = load.flatten(load.to_dict(old))
    after = load.flatten(load.to_dict(new))
    identity, other = [], []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            line = f"{key}: {before.get(key)!r} -> {after.get(key)!r}"
            (other if schema.non_identity(key) else identity).append(line)
    return identity, other


def check_run_dir(run_dir: Path) -> None:
    """Refuse a folder `cosmos-rl train` did not create."""
    if not (Path(run_dir) / MANIFEST).is_file():
        raise UserError(f"{run_dir}: not a run directory (no {MANIFEST}); pass the folder `cosmos-rl train` created")


def load_for_resume(run_dir: Path, overrides: list[str], *, exact: bool) -> tuple[schema.RunConfig, list[str]]:
    """Reload a run for `resume`: returns the config to continue with and notices to print."""
    run_dir = Path(run_dir)
    manifest = run_dir / MANIFEST
    check_run_dir(run_dir)
    saved = load.load(manifest, saved_run=True)
    config, problems = load.load_all_problems(manifest, overrides, saved_run=True)
    if config is None or any(p.severity == "error" for p in problems):
        raise ManifestError(problems, f"{manifest} with overrides")
    # The run directory stays where it is even when the run was moved or job.* changed. The saved
    # manifest is placed the same way before the two are compared, so a relative job.output_dir
    # ("runs") made absolute here is not reported as a change the user made.
    config, saved = (_placed(c, run_dir) for c in (config, saved))
    identity, other = identity_diff(saved, config)
    world_changes = [line for line in identity if line.split(":", 1)[0] in WORLD_FIELDS]
    blocking = [line for line in identity if line not in world_changes]
    if exact:
        blocking += world_changes
    elif world_changes and not algorithms.of(config).reshards_world:
        blocking += world_changes
    if blocking:
        raise ManifestError(
            [Problem(line.split(":", 1)[0], f"identity field changed on resume ({line.split(':', 1)[1].strip()})",
                     fix="resume with the run's own value, or start a new run") for line in blocking],
            f"resume {run_dir}" + (" --exact" if exact else ""),
        )
    _refuse_done(run_dir, config)  # before anything is written: a refused resume leaves the run as it was
    notices = [f"changed on resume: {line}" for line in other + world_changes]
    if not has_committed_checkpoint(run_dir):
        # Stopped before its first checkpoint (e.g. preempted while starting): nothing was lost.
        notices.append("no committed checkpoint yet: starting from step 0 with the run's saved manifest")
        (run_dir / METRICS).unlink(missing_ok=True)
    if world_changes:
        notices.append("world size changed: DCP reshards the checkpoint (allowed without --exact for DPO)")
    if notices:
        (run_dir / MANIFEST).write_text(load.to_toml(config), encoding="utf-8")
    problems = [p for p in problems if p.severity != "error"]
    return config, notices + [p.render() for p in problems]


def _placed(config: schema.RunConfig, run_dir: Path) -> schema.RunConfig:
    """`config` with job.output_dir and job.name naming where `run_dir` is."""
    where = Path(run_dir).resolve()
    return attrs.evolve(config, job=attrs.evolve(config.job, output_dir=str(where.parent), name=where.name))


def nothing_left(run_dir: Path, config: schema.RunConfig) -> int | None:
    """The step of the newest committed checkpoint when it is `rl.max_steps` and intact as this
    run's (meta.json readable, its algorithm and run identity this config's, every file present
    with its recorded size and checksum): a resume then has no step to train and starts no
    backend. None otherwise; the backend then opens the checkpoint and, should it not load, sets
    it aside and trains that step again."""
    from cosmos_rl.checkpoint import integrity

    root = layout.checkpoints_root(run_dir)
    done = layout.latest_committed(root)
    if done is None or done != config.rl.max_steps:
        return None
    try:
        meta = layout.read_meta(root, done)
    except layout.CheckpointError:
        return None
    if meta.get("algorithm") != config.rl.algorithm or meta.get("run_identity") != plan.run_identity(config):
        return None
    if integrity.damaged_files(layout.step_dir(root, done), meta, 0, 1):
        return None
    return done


def _refuse_done(run_dir: Path, config: schema.RunConfig) -> None:
    """A resume must have steps left: rl.max_steps below the newest committed step would start the
    backend (torchrun, Ray) to train nothing and show "step 4/2". Equal is let through: the newest
    checkpoint may prove unloadable once the backend opens it, and is then set aside and retrained."""
    done = layout.latest_committed(layout.checkpoints_root(run_dir))
    if done is not None and config.rl.max_steps < done:
        raise ManifestError(
            [Problem("rl.max_steps", f"the run has already done step {done} (its newest committed checkpoint), so a resume has no step to train",
                     config.rl.max_steps, f"resume with rl.max_steps={done + 1} or more to train further, or start a new run")],
            f"resume {run_dir}",
        )
