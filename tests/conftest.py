"""Shared fixtures. One local Ray cluster for the whole session (starting one costs seconds, and
every Ray test would otherwise pay it); code under test joins it through `ray.is_initialized()`."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Keep Ray and gloo on loopback and offline before anything imports them (docs/topology.md, "Platform traps").
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# ray.init replaces builtins.print with its tqdm-safe print in this process; tests that pickle
# `print` (the DCP unpickler's refusals) must see the real one whatever ran before them.
os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")

# Logical CPUs of the session cluster: enough for four 0.5-CPU actors even on a 1-core runner.
RAY_SESSION_CPUS = 2


@pytest.fixture(scope="session")
def ray_cluster():
    """A running local Ray cluster (loopback only, no dashboard); shut down at the end of the session."""
    import ray

    from cosmos_rl.dist.ray_group import local_ray_init_kwargs

    temp_dir = tempfile.mkdtemp(prefix="cosmos-rl-test-ray-")
    started = False
    try:
        if not ray.is_initialized():
            # Actors import the stand-in algorithms of tests/ by module name, as a user's own
            # algorithm module must be importable on every node; workers take the env of ray.init.
            here = os.path.dirname(os.path.abspath(__file__))
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
            ray.init(**local_ray_init_kwargs(temp_dir, num_cpus=RAY_SESSION_CPUS))
            started = True
        yield ray
    finally:
        if started:
            ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def shipped_manifests(tmp_path_factory):
    """A copy of manifests/ whose relative data paths find data written the way their headers say."""
    from _shipped_data import shipped_checkout

    return shipped_checkout(tmp_path_factory.mktemp("checkout")) / "manifests"


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory):
    """`run(manifest, overrides) -> run_dir`: an uninterrupted reference run trained in this process
    (`launch.train`), once per session for each (manifest, overrides), for every test file that
    compares against the same run: on 2 cores each Ray run's start (the stack imported in every
    actor) costs far more than its steps. Callers only read the run directory; a test that needs
    Ray asks for `ray_cluster` itself (the run joins it)."""
    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.config import load

    done: dict = {}

    def run(manifest, overrides: list[str]):
        key = (str(manifest), tuple(overrides))
        if key not in done:
            root = tmp_path_factory.mktemp("reference")
            config = load.load(manifest, [*overrides, f'job.output_dir="{root}"', 'job.name="reference"'])
            assert launch.train(config, manifest, Console(stderr=True)) == 0
            done[key] = root / "reference"
        return done[key]

    return run
