"""The built-in reward service: the reward ASGI app (`cosmos_rl.rewards.app`) hosted by uvicorn.

The trainer runs it in-process on a free loopback port (`RewardServer(...).start()`, served from a
background thread); an operator runs it standalone through `serve_forever_cli` (`cosmos-rl reward
serve`). The protocol is in `cosmos_rl.rewards.app`.

uvicorn waits for a request's headers forever once a connection is open; the protocol class here
closes a connection whose next request's headers have not arrived within `header_timeout_s`, so
slow or idle clients cannot pile up. The body has its own deadline in the app.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.app import SERVICE_NAME, RewardApp, ServiceState  # noqa: F401 (re-exported)
from cosmos_rl.rewards.limits import Limits
from cosmos_rl.rewards.registry import Reward, build_registry

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
# Seconds an idle kept-alive connection stays open between requests (the same under Ray Serve).
KEEP_ALIVE_S = 5
# Open connections (and requests) one service holds at most; past it uvicorn answers 503.
MAX_CONNECTIONS = 2048


def _protocol_class(header_timeout_s: float):
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        """Closes the connection when a request's headers are not complete within the deadline."""

        deadline_s = header_timeout_s  # read back by RewardServer.connection_limits

        def connection_made(self, transport) -> None:  # noqa: ANN001 (asyncio's signature)
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self.loop.call_later(header_timeout_s, self._deadline, self.cycle)

        def _deadline(self, cycle_then) -> None:
            if self.transport.is_closing() or self.cycle is not cycle_then:
                return  # closed already, or a new request's headers arrived in time
            if cycle_then is None or cycle_then.response_complete:
                self.transport.close()

    return HeaderDeadline


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on host:port, or UserError naming the address and a fix."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise UserError(f"--port {port}: must be 0-65535 (0 picks a free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --host/--port") from None
    return sock


class RewardServer:
    """The reward HTTP service, run on a background thread of the calling process."""

    app_class: type[RewardApp] = RewardApp  # the ASGI app it hosts (a subclass may host a variant)

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        revision: str | None = None,
        token: str | None = None,
        models: dict[str, str] | None = None,
        limits: Limits | None = None,
        registry: dict[str, Reward] | None = None,
        outside_suites: tuple[str, ...] = (),
        model_option: str = "--model",
    ):
        self.host = host
        self.port = port
        self.revision = revision
        self.token = token or None
        self.limits = limits or Limits()
        self._registry = registry if registry is not None else build_registry(models, outside_suites=outside_suites, option=model_option)
        self._state = ServiceState()
        self._app: RewardApp | None = None
        self._uvicorn = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> str:
        """Bind (port 0 picks a free one), serve on a daemon thread, return the base URL."""
        import uvicorn

        if self._uvicorn is not None:
            raise RuntimeError("reward server already started")
        try:
            sock = bind(self.host, self.port)
        except UserError as exc:
            raise OSError(str(exc)) from None
        self.port = sock.getsockname()[1]
        self._app = self.app_class(self._registry, self.revision, self.token, self.limits, self._state)
        config = uvicorn.Config(
            self._app.asgi, http=_protocol_class(self.limits.header_timeout_s), loop="asyncio", lifespan="off",
            log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_S, limit_concurrency=MAX_CONNECTIONS,
            backlog=MAX_CONNECTIONS, timeout_graceful_shutdown=1,
        )  # fmt: skip
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [sock]}, name="reward-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"reward server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        if self._uvicorn is None:
            return
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._app is not None:
            self._app.close()
        self._uvicorn = None
        self._thread = None
        self._app = None

    def __enter__(self) -> RewardServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def connection_limits(self) -> dict:
        """The connection-level limits the running server holds, read back from its uvicorn config
        (the same keys as RayServeService.connection_limits; docs/rewards.md compares them)."""
        config = self._uvicorn.config
        return {
            "header_timeout_s": float(config.http.deadline_s),
            "keep_alive_s": float(config.timeout_keep_alive),
            "request_timeout_s": None,  # the app's own deadlines: body_timeout_s, then score_timeout_s
            "body_timeout_s": self.limits.body_timeout_s,
            "score_timeout_s": self.limits.score_timeout_s,
        }

    # -- counters --------------------------------------------------------------------------
    @property
    def score_requests(self) -> int:
        """How many /score requests got as far as a complete body (answered with scores or an error)."""
        return self._state.score_requests

    def info(self) -> dict:
        return RewardApp(self._registry, self.revision).info()


def check_exposure(host: str, token: str | None, insecure: bool) -> None:
    """A service reachable from other hosts must ask for a token, unless the operator says otherwise."""
    from cosmos_rl.dist.addresses import is_loopback

    if not is_loopback(host) and not token and not insecure:
        raise UserError(
            f"--host {host} is reachable from other machines, and without a token anyone there can use the "
            "service; add --token-env VAR (a variable holding a secret clients send as a bearer token), "
            "or pass --insecure to serve without one"
        )


def serve_forever_cli(
    host: str, port: int, revision: str, token: str | None = None, models: dict[str, str] | None = None,
    insecure: bool = False, limits: Limits | None = None,
) -> None:  # fmt: skip
    """Run the service in the foreground until Ctrl-C or SIGTERM (for `cosmos-rl reward serve`)."""
    if not revision:
        raise UserError(
            "--revision is empty; the service must declare a revision that runs pin with "
            "rl.reward.revision, e.g. --revision builtin-v1"
        )
    check_exposure(host, token, insecure)
    bind(host, port).close()  # a bad --host/--port is a clean error before any model loads
    server = RewardServer(host=host, port=port, revision=revision, token=token, models=models, limits=limits)
    try:
        url = server.start()
    except OSError as exc:
        raise UserError(str(exc)) from None
    stopped = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    revisions = {name: r.revision for name, r in sorted(server._registry.items()) if name in (models or {})}
    print(
        f"reward service listening on {url} (revision {revision}, rewards {sorted(server._registry)}, "
        f"token {'required' if token else 'not required'})" + (f"; model revisions {revisions}" if revisions else ""),
        flush=True,
    )
    try:
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
