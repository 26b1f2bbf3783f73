"""Warm rank workers (dist/warm_workers.py): the environment rule, and a local cluster placing an actor on a worker it prestarted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cosmos_rl.dist import warm_workers

REPO = Path(__file__).resolve().parents[1]


def test_actor_env_is_the_actor_env_plus_the_cpus_rounded_down_at_least_one():
    """0.5 CPU -> 1 thread (Ray's rule for fractions), 2.99 -> 2, 4 -> 4; ACTOR_ENV always there."""
    for cpus, threads in ((0.5, "1"), (2.99, "2"), (4.0, "4")):
        env = warm_workers.actor_env(cpus)
        assert env == {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": threads}


def test_expected_cpus_follow_the_group_s_bundle_rule():
    """ActorGroup.bundle: cuda -> cpus_per_rank or 1.0; cpu -> cpus_per_rank, else the cluster's CPUs
    over the ranks rounded down to a hundredth: 2 CPUs / 3 ranks = 0.666 -> 0.66; 16 / 4 = 4.0."""
    assert warm_workers.expected_cpus_per_rank(0.0, "cuda", 8, 64) == 1.0
    assert warm_workers.expected_cpus_per_rank(6.0, "cuda", 8, 64) == 6.0
    assert warm_workers.expected_cpus_per_rank(1.5, "cpu", 4, 2) == 1.5
    assert warm_workers.expected_cpus_per_rank(0.0, "cpu", 3, 2) == 0.66
    assert warm_workers.expected_cpus_per_rank(0.0, "auto", 4, 16) == 4.0


def test_the_head_preloads_through_the_module_that_never_raises_and_starts_no_workers_of_its_own():
    config = warm_workers.system_config(4)
    assert config["preload_python_modules"] == ["cosmos_rl.dist.preload_stack"]
    assert importlib.util.find_spec(warm_workers.PRELOAD_MODULE) is not None
    assert config["prestart_worker_first_driver"] is False
    assert config["worker_maximum_startup_concurrency"] >= 4


def test_the_preload_covers_everything_the_coldstart_bench_stages():
    spec = importlib.util.spec_from_file_location("bench_coldstart", REPO / "bench" / "coldstart_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    missing = sorted(set(bench.ALL_MODULES) - set(warm_workers.MODULES))
    assert not missing, f"dist/warm_workers.py MODULES miss what an NFT actor imports: {missing}"


# In a process of its own: the test session's Ray cluster would be joined instead of a local head.
_PLACED_ON_A_PRESTARTED_WORKER = textwrap.dedent(
    """
    import json, os
    from cosmos_rl.core import schema
    from cosmos_rl.dist import ray_group
    from cosmos_rl.dist.ray_head import session_pids

    class Probe:
        def __init__(self, rank, world_size):
            import sys as s
            self.seen = {"pid": os.getpid(), "preloaded": "cosmos_rl.dist.preload_stack" in s.modules,
                         "env": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")}}
        def pick_port(self):
            return "127.0.0.1", 1
        def setup_world(self, address):
            return None
        def seen_at_init(self):
            return self.seen

    group = ray_group.ActorGroup(schema.GridConfig(device="cpu", timeout_s=120), 1, Probe)
    try:
        group.cluster.connect()
        before = session_pids(group.cluster._head.process.pid)  # the head's session: Ray's daemons and workers
        group.start()
        seen = group.call_one(0, "seen_at_init")
        print(json.dumps({**seen, "existed_before_the_actor": seen["pid"] in before}))
    finally:
        group.shutdown()
    """
)


@pytest.mark.slow
def test_a_local_cluster_places_the_rank_on_a_worker_it_prestarted_with_the_stack_imported():
    """The warm group's actor runs in a worker process that existed before the actor was asked for,
    had the stack imported before its constructor ran, and has the environment a cold actor gets."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _PLACED_ON_A_PRESTARTED_WORKER],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["existed_before_the_actor"], seen
    assert seen["preloaded"], seen
    # One rank on this host's CPUs gets them all (at least one thread): what a cold actor's runtime_env sets.
    assert seen["env"] == warm_workers.actor_env(float(os.cpu_count() or 1)), seen
