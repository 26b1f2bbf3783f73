"""The reward app on Ray Serve: `cosmos-rl reward serve --replicas N` for clusters.

Each replica builds the same `RewardApp` (registry, limits, token, batching) inside its own actor,
loading model rewards from the folder paths it is given (so they must exist on every node that
hosts a replica). Ray Serve's proxy spreads requests over the replicas; a training run reaches
the proxy by URL like any service. The cluster is the one `RAY_ADDRESS` / `--ray-address` names,
else a local one on 127.0.0.1, started the way training runs start theirs (`RayCluster`).

What differs from the uvicorn service: the connection-level limits are the proxy's (Ray Serve runs
its own uvicorn and takes no protocol class), so there is NO header deadline under --replicas: a
client trickling its headers holds its connection open (measured by bench/reward_bench.py). What
can be set is: the idle keep-alive (the uvicorn service's KEEP_ALIVE_S) and an end-to-end request
timeout from complete headers to the answer (the app's body and scoring deadlines added up). The
body-size, pixel and token checks run in the replica once the proxy forwards the request.
docs/rewards.md says what to put in front of the proxy when clients are not trusted.
"""

from __future__ import annotations

import os

import attrs

from cosmos_rl.core.errors import UserError
from cosmos_rl.dist.addresses import ray_address_problem
from cosmos_rl.rewards.limits import Limits
from cosmos_rl.rewards.server import KEEP_ALIVE_S

APP_NAME = "cosmos-rl-reward"
START_TIMEOUT_S = 300.0
REPLICAS_MAX = 1024


def _deployment_class():
    from ray import serve

    @serve.ingress()
    class RewardDeployment:
        """One replica: the registry is built here, in the replica's process."""

        def __init__(self, models: dict, revision: str, token: str | None, limits: dict):
            from cosmos_rl.rewards.app import RewardApp
            from cosmos_rl.rewards.registry import build_registry

            self._app = RewardApp(build_registry(models), revision, token, Limits(**limits))

        def __serve_build_asgi_app__(self):
            return self._app.asgi

    return RewardDeployment


class RayServeService:
    """The reward app on N Ray Serve replicas behind one HTTP proxy at host:port."""

    def __init__(
        self,
        host: str,
        port: int,
        revision: str,
        token: str | None = None,
        models: dict[str, str] | None = None,
        limits: Limits | None = None,
        replicas: int = 1,
        cpus_per_replica: float = 1.0,
        gpus_per_replica: float = 0.0,
        ray_address: str = "",
    ):
        if not 1 <= replicas <= REPLICAS_MAX:
            raise UserError(f"--replicas {replicas}: must be 1 to {REPLICAS_MAX}: each replica is a process holding every reward "
                            f"(and its models), and {REPLICAS_MAX} is past any reward fleet; serve fewer")  # fmt: skip
        address = ray_address or os.environ.get("RAY_ADDRESS", "")
        problem = ray_address_problem(address) if address else None
        if problem:
            where = "--ray-address" if ray_address else "RAY_ADDRESS"
            raise UserError(f"{where} {address!r}: {problem}; give the cluster as host:port or ray://host:port, or leave it empty for a local cluster")
        if cpus_per_replica < 0 or gpus_per_replica < 0:
            raise UserError("--cpus-per-replica and --gpus-per-replica must be >= 0")
        self.host, self.port, self.revision, self.token = host, port, revision, token or None
        self.models = dict(models or {})
        self.limits = limits or Limits()
        self.replicas, self.cpus, self.gpus = replicas, cpus_per_replica, gpus_per_replica
        self.ray_address = ray_address
        self._cluster = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> str:
        from cosmos_rl.core.schema import GridConfig
        from cosmos_rl.dist.ray_group import RayCluster

        self._cluster = RayCluster(GridConfig(ray_address=self.ray_address))
        self._cluster.connect()
        from ray import serve

        deployment = serve.deployment(
            name="reward", num_replicas=self.replicas,
            ray_actor_options={"num_cpus": self.cpus, "num_gpus": self.gpus},
        )(_deployment_class())  # fmt: skip
        serve.start(http_options={
            "host": self.host, "port": self.port, "keep_alive_timeout_s": KEEP_ALIVE_S,
            "request_timeout_s": self.limits.body_timeout_s + self.limits.score_timeout_s,
        })  # fmt: skip
        app = deployment.bind(self.models, self.revision, self.token, attrs.asdict(self.limits))
        try:
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
            self._wait_running()
        except Exception:
            self.stop()
            raise
        return self.url

    def connection_limits(self) -> dict:
        """The connection-level limits the running proxies hold, read back from Serve's controller
        (the same keys as RewardServer.connection_limits)."""
        import ray
        from ray.serve.context import _get_global_client

        options = ray.get(_get_global_client()._controller.get_http_config.remote())
        return {
            "header_timeout_s": None,  # Ray Serve's proxy has none (see the module's docstring)
            "keep_alive_s": float(options.keep_alive_timeout_s),
            "request_timeout_s": options.request_timeout_s,
            "body_timeout_s": self.limits.body_timeout_s,
            "score_timeout_s": self.limits.score_timeout_s,
        }

    def _wait_running(self) -> None:
        import time

        from ray import serve

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            status = serve.status().applications.get(APP_NAME)
            state = str(getattr(status, "status", ""))
            if state.endswith("RUNNING"):
                return
            if state.endswith("DEPLOY_FAILED"):
                message = getattr(status, "message", "") or "see the Ray logs"
                raise UserError(f"the reward replicas failed to start: {message.strip().splitlines()[-1][:400]}")
            time.sleep(0.2)
        raise UserError(f"the reward replicas did not start within {START_TIMEOUT_S:g} s; check the cluster's free resources")

    def stop(self) -> None:
        import ray
        from ray import serve

        if ray.is_initialized():
            try:
                serve.shutdown()
            except Exception:  # shutting down a half-started Serve must not hide the first error
                pass
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None


def serve_forever_ray(
    host: str, port: int, revision: str, token: str | None, models: dict[str, str], insecure: bool,
    replicas: int, cpus_per_replica: float, gpus_per_replica: float, ray_address: str,
) -> None:  # fmt: skip
    """`cosmos-rl reward serve --replicas N`: run until Ctrl-C or SIGTERM, then take the replicas down."""
    import signal
    import threading

    from cosmos_rl.rewards.server import bind, check_exposure

    if not revision:
        raise UserError("--revision is empty; the service must declare a revision that runs pin, e.g. --revision builtin-v1")
    check_exposure(host, token, insecure)
    probe = bind(host, port)  # a bad --host/--port is a clean error before Ray starts
    port = probe.getsockname()[1]  # Ray Serve needs a fixed port: 0 becomes a free one now
    probe.close()
    service = RayServeService(host, port, revision, token, models, None, replicas, cpus_per_replica, gpus_per_replica, ray_address)
    stopped = threading.Event()
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        url = service.start()
        if on_main:  # again: connecting to Ray put its own SIGTERM handler (abort, exit -6) in place
            signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        print(
            f"reward service listening on {url} (revision {revision}, {replicas} Ray Serve replica(s), "
            f"models {sorted(models) or 'none'}, token {'required' if token else 'not required'})",
            flush=True,
        )
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()
