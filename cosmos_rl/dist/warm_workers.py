"""Rank workers that a private local Ray cluster starts, and fills with the stack's imports, before the actors exist.

A rank actor's start-up is nearly all imports (torch, FSDP2, peft/transformers, diffusers: about 4 CPU
seconds a process, docs/studies/2026-12-03-nft-cold-start.md). Ray can do that work ahead of time: its
raylet starts Python workers on request and has each one import the modules named in the
`preload_python_modules` system setting before it takes work. An actor is then placed on such an
idle worker only if the worker fits it (the raylet's `WorkerPool::FindAndPopIdleWorker`; a misfit
is its `RUNTIME_ENV_MISMATCH`): a worker with no job yet fits any job, but its runtime environment
must be the actor's exactly. A per-actor or per-job `runtime_env` therefore rules every prestarted worker out.

So a local head (dist/ray_head.py) that warms workers starts its daemons with the actors'
environment variables already set (`actor_env`: the workers inherit them from the raylet), the
driver joins without a job `runtime_env`, and `ActorGroup` leaves the actors' `runtime_env` out when
the cluster's workers already carry the exact environment it would give them; otherwise it sets it
as before and Ray starts fresh workers. The effective environment of a rank is the same either way
(thread counts included, which the numbers depend on).

The head asks its raylet for `count` workers through the raylet's `PrestartWorkers` call (the one
Ray's core worker uses for the same purpose; Ray 2.x has no public Python API for it), with a
keep-alive so that the idle-worker reaper leaves them alone until the actors come, and answers the
driver once they have registered (an actor asked for before its worker registered makes Ray start
another one). If either fails (another Ray version), the run only starts cold, as before.
"""

from __future__ import annotations

import importlib
import os
import time


# No GLOO_SOCKET_IFNAME here: pinning gloo to `lo` breaks a multi-host world. world.loopback_gloo pins it
# in each rank only when the rendezvous address (rank 0's) is a loopback one.
ACTOR_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# What a rank actor of any Ray-driven algorithm imports (bench/coldstart_bench.py's stages, which
# tests/test_bench_coldstart.py keeps in step with the trainers), in the order the stack pulls it in.
MODULES = (
    "torch", "torch.distributed.fsdp", "torch.distributed.checkpoint", "ray", "peft",
    "diffusers.models.transformers.transformer_cosmos3", "diffusers.models.autoencoders.autoencoder_kl_wan",
    "diffusers.schedulers.scheduling_unipc_multistep", "diffusers.pipelines.cosmos.pipeline_cosmos3_omni",
    "cosmos_rl.trainers.ray_driver", "cosmos_rl.trainers.spmd_worker", "cosmos_rl.trainers.online",
    "cosmos_rl.trainers.nft", "cosmos_rl.trainers.grpo", "cosmos_rl.trainers.dpo", "cosmos_rl.trainers.first_frames", "cosmos_rl.trainers.online_policy",
    "cosmos_rl.config.algorithms", "cosmos_rl.models.generate", "cosmos_rl.models.sampler_settings",
    "cosmos_rl.models.setup", "cosmos_rl.models.lora", "cosmos_rl.models.packing", "cosmos_rl.models.sampling",
    "cosmos_rl.models.text", "cosmos_rl.models.vae", "cosmos_rl.rewards.client", "cosmos_rl.rewards.functions",
    "cosmos_rl.data.prompts", "cosmos_rl.data.images", "cosmos_rl.data.pixels", "cosmos_rl.core.media",
    "cosmos_rl.core.flow", "cosmos_rl.models.text_kv", "cosmos_rl.dist.world", "cosmos_rl.dist.fsdp", "cosmos_rl.dist.context_parallel", "cosmos_rl.evaluation.evaluator",
    "cosmos_rl.evaluation.grid",
)  # fmt: skip
# The module Ray's workers import before taking work: it imports MODULES and never raises.
PRELOAD_MODULE = "cosmos_rl.dist.preload_stack"
# How long prestarted workers wait, idle, for their actors before Ray may reap them: the driver
# creates the actors within seconds of the head's answer, but a slow first placement must not lose them.
KEEP_ALIVE_S = 600
# How long the head waits for them to register with the raylet (Python's start and `import ray`; the
# imports come after): an actor asked for before its worker registered makes Ray start another worker.
REGISTER_TIMEOUT_S = 60.0


def actor_env(cpus_per_rank: float) -> dict[str, str]:
    """The environment variables every rank actor runs with: offline hub, quiet tokenizers, and one
    CPU thread budget (Ray's own rule for an actor's OMP_NUM_THREADS: its CPUs rounded down, at least 1)."""
    return {**ACTOR_ENV, "OMP_NUM_THREADS": str(max(1, int(cpus_per_rank)))}


def expected_cpus_per_rank(cpus_per_rank: float, device: str, size: int, host_cpus: int | None) -> float:
    """The CPUs `ActorGroup.bundle` will give a rank on a local cluster of `host_cpus` CPUs, known
    before the cluster starts (the head must set the workers' environment before they exist).
    A wrong guess costs only speed: the group then sets the actor's environment itself."""
    if device == "cuda":
        return cpus_per_rank or 1.0
    if cpus_per_rank:
        return float(cpus_per_rank)
    return int((host_cpus or 1) / size * 100) / 100


def system_config(count: int) -> dict:
    """The head's `_system_config`: workers preload the stack; none are started for the head's own
    driver (Ray's default starts one per CPU, each of which would now import the whole stack)."""
    return {
        "preload_python_modules": [PRELOAD_MODULE],
        "prestart_worker_first_driver": False,
        # Ray allows only min(cores, CPUs) workers to be starting at once and drops prestart
        # requests past that; the ranks' workers must all start now.
        "worker_maximum_startup_concurrency": max(count, os.cpu_count() or 1),
    }


def prestart(node_manager_port: int, count: int) -> str:
    """Have the local raylet start `count` idle Python workers (no job, no runtime env) and wait until
    they have registered. '' when they have, else why not (the actors then start, at worst, cold)."""
    try:
        import grpc
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

        request = node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.PYTHON, num_workers=count, keep_alive_duration_secs=KEEP_ALIVE_S
        )
        with grpc.insecure_channel(f"127.0.0.1:{node_manager_port}") as channel:
            raylet = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
            raylet.PrestartWorkers(request, timeout=30)
            deadline = time.monotonic() + REGISTER_TIMEOUT_S
            while time.monotonic() < deadline:  # the head's cluster has no other workers yet; its driver is this process
                pids = raylet.GetWorkerPIDs(node_manager_pb2.GetWorkerPIDsRequest(), timeout=30).pids
                if len(set(pids) - {os.getpid()}) >= count:
                    return ""
                time.sleep(0.1)
        return f"the {count} workers did not register within {REGISTER_TIMEOUT_S:.0f} s"
    except Exception as exc:  # noqa: BLE001 - any failure only means a cold start
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def preload() -> float:
    """Import MODULES, skipping any that fail (the actor imports it again and reports the error
    itself, with its own traceback); the time it finished (bench/coldstart_bench.py reads it)."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - see above
            continue
    return time.time()
