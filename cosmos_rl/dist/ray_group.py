"""A Ray actor group whose actors form one torch.distributed world (NFT's colocated topology).

The group starts a local Ray cluster (or joins `grid.ray_address` / RAY_ADDRESS, or a cluster this
process already started, e.g. the test suite's), reserves one placement-group bundle per rank,
waits for the placement before creating any actor (an actor that never gets scheduled would leave
the others waiting in `init_process_group` forever), creates one actor per rank and has them form a
gloo/NCCL process group on a free loopback port picked by rank 0.

Every wait has a timeout. `call_all` turns a dead, failing or stuck actor into `RunFailed` naming
the rank (a user mistake raised inside an actor stays a `UserError`), and returns as soon as one
rank fails rather than waiting for the others, which are then typically stuck in a collective.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from typing import Any

from cosmos_rl.core import schema
from cosmos_rl.dist.addresses import free_loopback_port, is_loopback
from cosmos_rl.dist.ray_head import ACTOR_ENV, LOOPBACK_ENV, Head, local_ray_init_kwargs  # noqa: F401 (re-exported)
from cosmos_rl.dist.warm_workers import actor_env, expected_cpus_per_rank
from cosmos_rl.core.errors import HackingStopped, Preempted, RunFailed, UserError

# Seconds the placement group may take to become ready before we report needed vs available.
PLACEMENT_TIMEOUT_S = 60.0
# Added to the collective timeout for Ray's own overhead (actor start-up, imports, serialisation).
CALL_SLACK_S = 120.0

def master_address(picked: tuple[str, int], nodes: list[tuple[str, str]]) -> tuple[str, int]:
    """The process group's rendezvous address: rank 0's own node address once the ranks span nodes.

    `picked` is what rank 0's `pick_port` answered; `nodes` is (node id, node ip) per rank, as each
    actor reported it from inside (ray.util.get_node_ip_address). A loopback (or any) address that
    rank 0 picked is only reachable by every rank when they all share its node.
    """
    if len({node_id for node_id, _ in nodes}) > 1:
        return nodes[0][1], picked[1]
    return picked


def _where(actor) -> tuple[str, str, int]:
    """Run inside an actor (through `__ray_call__`): its node id, node ip and pid."""
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()


class RayCluster:
    """Connection to a Ray cluster; shuts down only what it started itself.

    `warm_count` > 0: a local cluster this starts has `warm_count` workers import the stack ahead of
    the actors, all its workers running with `warm_env` (dist/warm_workers.py); `worker_env` is then
    that environment, else None (a joined cluster: nothing known about its workers)."""

    def __init__(self, grid: schema.GridConfig, warm_env: dict | None = None, warm_count: int = 0):
        self.grid = grid
        self.started = False
        self._head: Head | None = None
        self.warm_env, self.warm_count = warm_env, warm_count
        self.worker_env: dict | None = None
        if not self.address():
            # Ray reads these when it is imported: set before any `import ray` of this process, they
            # keep a local cluster's GCS, raylet and actors on 127.0.0.1 instead of the host's address.
            for key, value in LOOPBACK_ENV.items():
                os.environ.setdefault(key, value)

    def address(self) -> str:
        """The cluster to join: grid.ray_address, else $RAY_ADDRESS; empty = start a local one."""
        return self.grid.ray_address or os.environ.get("RAY_ADDRESS", "")

    def connect(self) -> None:
        import ray

        if ray.is_initialized():
            return  # e.g. the test session's cluster: join it, leave it running
        address = self.address()
        if address:
            try:
                ray.init(address=address, configure_logging=False, runtime_env={"env_vars": dict(ACTOR_ENV)})
            except (ConnectionError, RuntimeError) as exc:
                raise RunFailed(f"cannot join the Ray cluster at {address!r}: {_first_line(exc)}") from None
            return
        import ray.util

        node_ip = ray.util.get_node_ip_address()  # what a local cluster of this process would bind
        if not is_loopback(node_ip):
            raise RunFailed(
                f"the local Ray cluster would bind {node_ip}, not 127.0.0.1: Ray was imported before "
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set; set it in the environment, or give grid.ray_address"
            )
        # The head runs in a session of its own (dist/ray_head.py): a stop signal sent to this
        # process's group leaves Ray's daemons running until the driver has committed, and the head
        # cleans up (daemons, agents, its temp folder) once this process is gone, however it went.
        # A short path: Ray's unix sockets live under it and must stay below ~107 characters.
        warm = self.warm_count > 0 and self.warm_env is not None
        self._head = Head(tempfile.mkdtemp(prefix="cosmos-rl-ray-"), warm_env=self.warm_env, warm_count=self.warm_count if warm else 0)
        # Warm: no job runtime_env, which would rule out every prestarted worker; the workers have ACTOR_ENV already.
        job_env = None if warm else {"env_vars": dict(ACTOR_ENV)}
        try:
            ray.init(address=self._head.info["gcs_address"], configure_logging=False, log_to_driver=True, runtime_env=job_env)
        except BaseException:
            self.shutdown()
            raise
        self.started = True
        self.worker_env = dict(self.warm_env) if warm else None

    def remove_on_exit(self, path: str) -> None:
        """A run file the local cluster's head removes even if this process is SIGKILLed."""
        if self._head is not None:
            self._head.remove_on_exit(path)

    def shutdown(self) -> None:
        import ray

        if self.started and ray.is_initialized():
            ray.shutdown()
        self.started = False
        if self._head is not None:
            self._head.stop()  # the cluster's processes and its temp folder
            self._head = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


_RAISED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): .+")


def _cause_line(exc: BaseException) -> str:
    """Ray's actor-death text starts with a generic sentence and ends with the actor's own
    traceback; the last `SomeError: message` line in it is the cause a user needs."""
    lines = [line for line in str(exc).splitlines() if _RAISED.match(line)]
    return lines[-1].strip()[:400] if lines else _first_line(exc)


def _unwrap(exc: BaseException) -> BaseException:
    """The exception an actor method raised, from Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class RankActor:
    """What every rank actor of an ActorGroup shares: one CPU thread budget, the quiet FSDP2
    warning, and the two calls that form the process group (`pick_port` on rank 0, then
    `setup_world` on all). Subclasses set `self.rank`, `self.world_size` and `self.config`."""

    def _init_rank(self, rank: int, world_size: int, config) -> None:
        import torch

        from cosmos_rl.dist.fsdp import quiet_view_output_warning

        self.rank, self.world_size, self.config = rank, world_size, config
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        quiet_view_output_warning()

    def pick_port(self) -> tuple[str, int]:
        port = free_loopback_port()
        _remove_stale(store_file_for(port))  # a crashed run's file would hand this one stale keys
        if self.config.grid.nodes > 1:
            import ray

            return ray.util.get_node_ip_address(), port
        return "127.0.0.1", port

    def setup_world(self, address: tuple[str, int]) -> None:
        from cosmos_rl.dist import world

        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address[0], str(address[1])
        # Ray shows each GPU actor exactly its own device, as cuda:0.
        self.device = world.pick_device(self.config.grid.device, 0)
        # On one host (a loopback rendezvous address) the ranks meet through a file, so no store
        # socket is opened at all; across hosts they meet at rank 0's node address.
        store_file = store_file_for(address[1]) if is_loopback(address[0]) else None
        world.init_process_group(self.device, self.rank, self.world_size, self.config.grid.timeout_s, store_file=store_file)


def store_file_for(port: int) -> str:
    """The file a single-host group rendezvouses through; the port rank 0 picked keeps it unique."""
    return os.path.join(tempfile.gettempdir(), f"cosmos-rl-store-{port}")


def _remove_stale(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class ActorGroup:
    """`size` actors of `actor_cls`, one per rank, forming one process group.

    `actor_cls` is a plain class whose constructor takes `(rank, world_size, *init_args)` and which
    has `pick_port()` and `setup_world(address)` (address = rank 0's `pick_port()` answer, a
    (host, port) pair); its other methods are called with `call_all`.
    """

    def __init__(
        self, grid: schema.GridConfig, size: int, actor_cls: type, init_args: tuple = (), warm: bool = True, spare_workers: int = 0
    ):
        """`warm`: a local cluster this group starts prestarts one worker per rank, plus `spare_workers`
        for other actors placed before the ranks, with the stack imported (dist/warm_workers.py);
        False starts every actor's process cold (bench/coldstart_bench.py compares the two)."""
        self.grid = grid
        self.size = size
        self.actor_cls = actor_cls
        self.init_args = init_args
        cpus = expected_cpus_per_rank(grid.cpus_per_rank, grid.device, size, os.cpu_count())
        self.cluster = RayCluster(grid, actor_env(cpus), size + spare_workers if warm else 0)
        self.actors: list = []
        self._placement = None
        # Per rank, once started: {"rank", "node_id", "node_ip", "pid"} (see `placement_record`).
        self.placement: list[dict] = []
        self.master_addr: str | None = None
        self._store_file: str | None = None

    # ----------------------------------------------------------------- start-up
    def bundle(self) -> dict[str, float]:
        import ray

        if self.grid.device == "cuda":
            return {"GPU": 1.0, "CPU": self.grid.cpus_per_rank or 1.0}
        if self.grid.cpus_per_rank:
            return {"CPU": float(self.grid.cpus_per_rank)}
        cpus = float(ray.cluster_resources().get("CPU", 0.0))
        # Round down to a hundredth so that `size` bundles always fit the cluster's total.
        per_rank = int(cpus / self.size * 100) / 100
        if per_rank <= 0:
            raise UserError(
                f"grid.cpus_per_rank: the Ray cluster has {cpus} CPUs, too few for {self.size} ranks; "
                "set grid.cpus_per_rank or join a larger cluster with grid.ray_address"
            )
        return {"CPU": per_rank}

    def check_resources(self, bundle: dict[str, float]) -> None:
        """Fail at once when the cluster's totals cannot hold the plan (a placement would only time out)."""
        import ray

        needed = {k: round(v * self.size, 3) for k, v in bundle.items()}
        total = {k: float(ray.cluster_resources().get(k, 0.0)) for k in bundle}
        short = {k: v for k, v in needed.items() if v > total[k] + 1e-9}
        if "GPU" in short:  # a GPU manifest on a cluster without (enough) GPUs: not a CPU-count problem
            raise UserError(
                f'grid.device: "cuda" puts each of the {self.size} ranks on its own GPU, but the Ray cluster has '
                f"{total['GPU']:g} GPU(s); run where the GPUs are (or join that cluster with grid.ray_address), "
                'or set grid.device = "cpu" (model.dtype = "float32" is faster there)'
            )
        if short:
            raise UserError(
                f"grid: {self.size} ranks ({bundle} each) needs {needed}, but the Ray cluster has {total} in total "
                f"({len(ray.nodes())} node(s)); lower grid.cpus_per_rank, use fewer ranks, or join a larger cluster"
            )

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cluster.connect()
        bundle = self.bundle()
        self.check_resources(bundle)
        strategy = "SPREAD" if self.grid.nodes > 1 else "PACK"
        self._placement = placement_group([dict(bundle)] * self.size, strategy=strategy)
        if not self._placement.wait(timeout_seconds=min(PLACEMENT_TIMEOUT_S, self.grid.timeout_s)):
            needed = {k: round(v * self.size, 3) for k, v in bundle.items()}
            available = {k: ray.available_resources().get(k, 0.0) for k in bundle}
            total = {k: ray.cluster_resources().get(k, 0.0) for k in bundle}
            raise UserError(
                f"grid: the Ray placement group for {self.size} ranks ({bundle} each) did not become ready: "
                f"needs {needed}, cluster has {total} ({available} available); lower grid.cpus_per_rank, "
                "free the cluster, or add nodes"
            )
        remote_cls = ray.remote(self.actor_cls)
        cpus = bundle.get("CPU", 0.0)
        env = actor_env(cpus)
        # Leaving runtime_env out lets Ray place the actor on a prestarted worker, which has exactly this env already.
        runtime_env = None if self.cluster.worker_env == env else {"env_vars": env}
        self.actors = [
            remote_cls.options(
                num_cpus=cpus,
                num_gpus=bundle.get("GPU", 0.0),
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement, placement_group_bundle_index=rank
                ),
                runtime_env=runtime_env,
            ).remote(rank, self.size, *self.init_args)
            for rank in range(self.size)
        ]
        where = self.call_all("__ray_call__", _where)
        self.placement = [
            {"rank": rank, "node_id": node_id, "node_ip": node_ip, "pid": pid}
            for rank, (node_id, node_ip, pid) in enumerate(where)
        ]
        picked = self.call_one(0, "pick_port")
        address = master_address(tuple(picked), [(n, ip) for n, ip, _ in where])
        self.master_addr = address[0]
        if is_loopback(address[0]):  # setup_world then pins gloo to `lo` (world.loopback_gloo)
            self._store_file = store_file_for(address[1])
            self.cluster.remove_on_exit(self._store_file)
        self.call_all("setup_world", address)

    # ----------------------------------------------------------------- placement record
    def placement_record(self) -> dict:
        """Where the ranks landed: {"ranks": [...], "nodes": {node_id: {"node_ip", "ranks"}}, ...}."""
        nodes: dict[str, dict] = {}
        for entry in self.placement:
            node = nodes.setdefault(entry["node_id"], {"node_ip": entry["node_ip"], "ranks": []})
            node["ranks"].append(entry["rank"])
        strategy = "SPREAD" if self.grid.nodes > 1 else "PACK"
        return {
            "world_size": self.size, "strategy": strategy, "master_addr": self.master_addr,
            "ranks": list(self.placement), "nodes": nodes,
        }  # fmt: skip

    def placement_summary(self) -> str:
        """One line, e.g. `4 ranks on 2 nodes: 10.0.0.1 (node 1a2b3c4d) ranks 0,2; 10.0.0.2 (...) ranks 1,3`."""
        nodes = self.placement_record()["nodes"]
        parts = [
            f"{node['node_ip']} (node {node_id[:8]}) rank{'s' if len(node['ranks']) > 1 else ''} "
            + ",".join(map(str, node["ranks"]))
            for node_id, node in nodes.items()
        ]
        noun = "node" if len(nodes) == 1 else "nodes"
        return f"{len(self.placement)} ranks on {len(nodes)} {noun}: " + "; ".join(parts)

    def write_placement(self, run_dir) -> str:
        """Write `<run_dir>/placement.json` and return its path."""
        path = os.path.join(str(run_dir), "placement.json")
        os.makedirs(str(run_dir), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.placement_record(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
        return path

    # ----------------------------------------------------------------- calls
    def _timeout(self, timeout_s: float | None) -> float:
        return timeout_s if timeout_s is not None else self.grid.timeout_s + CALL_SLACK_S

    def call_one(self, rank: int, method: str, *args, timeout_s: float | None = None) -> Any:
        return self._gather({rank: getattr(self.actors[rank], method).remote(*args)}, method, timeout_s)[rank]

    def call_all(self, method: str, *args, timeout_s: float | None = None) -> list:
        """`method(*args)` on every actor at once; the answers in rank order."""
        refs = {rank: getattr(actor, method).remote(*args) for rank, actor in enumerate(self.actors)}
        answers = self._gather(refs, method, timeout_s)
        return [answers[rank] for rank in range(len(self.actors))]

    def _gather(self, refs: dict[int, Any], method: str, timeout_s: float | None) -> dict[int, Any]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        limit = self._timeout(timeout_s)
        deadline = time.monotonic() + limit
        rank_of = {ref: rank for rank, ref in refs.items()}
        pending, answers = list(refs.values()), {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(rank_of[ref] for ref in pending)
                raise RunFailed(
                    f"rank {', '.join(map(str, late))}: no answer to {method} within {limit:.0f} s "
                    "(stuck or too slow; raise grid.timeout_s if the work is legitimately this slow)"
                )
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                rank = rank_of[ref]
                try:
                    answers[rank] = ray.get(ref, timeout=max(1.0, left))
                except RayActorError as exc:
                    raise RunFailed(f"rank {rank}: the actor died during {method}: {_cause_line(exc)}") from None
                except GetTimeoutError:
                    raise RunFailed(f"rank {rank}: no answer to {method} within {limit:.0f} s") from None
                except RayTaskError as exc:
                    cause = _unwrap(exc)
                    if isinstance(cause, (UserError, Preempted, HackingStopped, RunFailed)):
                        raise cause from None  # RunFailed: its one line already names the rank and cause
                    raise RunFailed(
                        f"rank {rank}: {method} failed: {type(cause).__name__}: {_first_line(cause)}"
                    ) from exc
        return answers

    # ----------------------------------------------------------------- teardown
    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            for actor in self.actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # already dead: nothing left to stop
                    pass
            if self._placement is not None:
                try:
                    from ray.util.placement_group import remove_placement_group

                    remove_placement_group(self._placement)
                except Exception:
                    pass
        self.actors, self._placement = [], None
        if self._store_file:
            # The ranks' rendezvous file; it lives on this host whenever the cluster is local (a
            # one-node remote cluster keeps its few bytes in that node's temp folder).
            _remove_stale(self._store_file)
            self._store_file = None
        self.cluster.shutdown()

