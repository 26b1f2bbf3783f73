"""The built-in reward service: a small HTTP server over the weight-free reward functions.

Protocol (JSON over HTTP; every endpoint needs `Authorization: Bearer <token>` when the server
has a token, else answers 401):
    GET  /info  -> {"name": str, "revision": str | null, "rewards": [str, ...]}
    POST /score    {"reward": str, "prompts": [str, ...], "images": [base64 PNG (RGB), ...]}
                -> {"scores": [float, ...], "revision": str | null}
Errors come back as {"error": message} with 400 (bad request), 401, 404, 413 or 500.

The trainer runs it in-process on a free loopback port (`RewardServer(...).start()`); an
operator runs it standalone through `serve_forever_cli`. Tests can make /score misbehave on
purpose with `inject_faults` to exercise the client's retries against the real server.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
import json
import logging
import signal
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image, UnidentifiedImageError

from cosmos_rl.errors import UserError
from cosmos_rl.rewards.functions import REWARDS

log = logging.getLogger(__name__)

SERVICE_NAME = "cosmos-rl-builtin"
MAX_BODY_BYTES = 1 << 30  # 1 GiB: a few hundred 1024^2 PNGs; beyond that is a client bug

# Faults a test can queue for /score; each request consumes one, in order.
#   http_500         answer 500
#   garbage          answer 200 with a body that is not JSON
#   wrong_count      answer 200 with one score too few
#   wrong_revision   answer 200 with a different revision than the server declares
#   drop_connection  close the connection without answering
#   delay:<seconds>  wait, then answer normally
FAULTS = ("http_500", "garbage", "wrong_count", "wrong_revision", "drop_connection")


class _BadRequest(Exception):
    """The request is malformed; answered with 400 and this message."""


def _decode_images(encoded: list) -> np.ndarray:
    arrays = []
    for i, item in enumerate(encoded):
        if not isinstance(item, str):
            raise _BadRequest(f"images[{i}] must be a base64 string, got {type(item).__name__}")
        try:
            image = Image.open(io.BytesIO(base64.b64decode(item, validate=True)))
            image.load()
        except (binascii.Error, UnidentifiedImageError, OSError) as exc:
            raise _BadRequest(f"images[{i}] is not a base64-encoded image: {exc}") from None
        if image.mode != "RGB":
            # Converting RGBA/L here would score something other than what the model made.
            raise _BadRequest(f"images[{i}] has mode {image.mode}; send RGB images")
        arrays.append(np.asarray(image, dtype=np.uint8))
    if not arrays:
        raise _BadRequest("images is empty; send at least one image")
    sizes = {a.shape for a in arrays}
    if len(sizes) != 1:
        raise _BadRequest(f"all images in one request must share a size, got {sorted(sizes)}")
    return np.stack(arrays)


def _parse_score_request(body: bytes) -> tuple[str, list[str], np.ndarray]:
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise _BadRequest("body must be a JSON object with reward, prompts and images")
    missing = [k for k in ("reward", "prompts", "images") if k not in request]
    if missing:
        raise _BadRequest(f"missing fields {missing}")
    reward, prompts, images = request["reward"], request["prompts"], request["images"]
    if reward not in REWARDS:
        raise _BadRequest(f"unknown reward {reward!r}; this service offers {sorted(REWARDS)}")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise _BadRequest("prompts must be a list of strings")
    if not isinstance(images, list):
        raise _BadRequest("images must be a list of base64 PNG strings")
    if len(prompts) != len(images):
        raise _BadRequest(f"got {len(images)} images but {len(prompts)} prompts")
    return reward, prompts, _decode_images(images)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck request must not keep stop() or the process waiting

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            # The client gave up (timeout) or went away; it retries or reports on its side.
            log.debug("reward server: client %s hung up: %r", client_address, exc)
        else:
            log.exception("reward server: request from %s failed", client_address)


class RewardServer:
    """The reward HTTP service, run on a background thread of the calling process."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        revision: str | None = None,
        token: str | None = None,
    ):
        self.host = host
        self.port = port
        self.revision = revision
        self.token = token or None
        self._faults: deque[str] = deque()
        self._lock = threading.Lock()
        self._score_requests = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> str:
        """Bind (port 0 picks a free one), serve on a daemon thread, return the base URL."""
        if self._httpd is not None:
            raise RuntimeError("reward server already started")
        self._httpd = _HTTPServer((self.host, self.port), _make_handler(self))
        self.port = self._httpd.server_address[1]
        # A short poll interval makes stop() return quickly (shutdown waits for one poll).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="reward-server",
            daemon=True,
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> RewardServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- test hooks ------------------------------------------------------------------------
    def inject_faults(self, *faults: str) -> None:
        """Queue faults for the next /score requests, one per request (see FAULTS)."""
        for fault in faults:
            if fault not in FAULTS and not _is_delay(fault):
                raise ValueError(f"unknown fault {fault!r}; use one of {FAULTS} or 'delay:<s>'")
        with self._lock:
            self._faults.extend(faults)

    @property
    def score_requests(self) -> int:
        """How many /score requests have arrived (including faulted ones)."""
        with self._lock:
            return self._score_requests

    def _next_fault(self) -> str | None:
        with self._lock:
            self._score_requests += 1
            return self._faults.popleft() if self._faults else None

    def info(self) -> dict:
        return {"name": SERVICE_NAME, "revision": self.revision, "rewards": sorted(REWARDS)}


def _is_delay(fault: str) -> bool:
    if not fault.startswith("delay:"):
        return False
    try:
        return float(fault.split(":", 1)[1]) >= 0
    except ValueError:
        return False


def _make_handler(owner: RewardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib name)
            log.debug("reward server: " + format, *args)

        def _send_json(self, status: int, payload: dict, extra_headers: dict | None = None):
            self._send_bytes(status, json.dumps(payload).encode(), extra_headers)

        def _send_bytes(self, status: int, body: bytes, extra_headers: dict | None = None):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (extra_headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if owner.token is None:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {owner.token}".encode()):
                return True
            self._send_json(
                401,
                {"error": "missing or wrong bearer token"},
                {"WWW-Authenticate": "Bearer"},
            )
            return False

        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            if not self._authorised():
                return
            if self.path == "/info":
                self._send_json(200, owner.info())
            else:
                self._send_json(404, {"error": f"no such endpoint {self.path}; try /info"})

        def do_POST(self) -> None:  # noqa: N802 (stdlib name)
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                self._send_json(400, {"error": "Content-Length must be a non-negative integer"})
                return
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send_json(413, {"error": f"body of {length} bytes is over {MAX_BODY_BYTES}"})
                return
            body = self.rfile.read(length)  # read before any answer so the client is not cut off
            if not self._authorised():
                return
            if self.path != "/score":
                self._send_json(404, {"error": f"no such endpoint {self.path}; try /score"})
                return
            self._score(body)

        def _score(self, body: bytes) -> None:
            fault = owner._next_fault()
            if fault is not None and _is_delay(fault):
                time.sleep(float(fault.split(":", 1)[1]))
                fault = None
            if fault == "http_500":
                self._send_json(500, {"error": "injected fault: http_500"})
                return
            if fault == "garbage":
                self._send_bytes(200, b"<html>this is not json")
                return
            if fault == "drop_connection":
                self.close_connection = True
                return
            try:
                reward, prompts, images = _parse_score_request(body)
                scores = [float(s) for s in REWARDS[reward](images, prompts)]
            except (_BadRequest, ValueError) as exc:
                self._send_json(400, {"error": str(exc)})
                return
            except Exception as exc:  # a reward bug: report it, keep serving other requests
                log.exception("reward function failed")
                self._send_json(500, {"error": f"reward function failed: {exc!r}"})
                return
            revision = owner.revision
            if fault == "wrong_count":
                scores = scores[:-1]
            elif fault == "wrong_revision":
                revision = f"{revision}-other"
            self._send_json(200, {"scores": scores, "revision": revision})

    return Handler


def serve_forever_cli(host: str, port: int, revision: str, token: str | None = None) -> None:
    """Run the service in the foreground until Ctrl-C or SIGTERM (for `cosmos-rl reward serve`)."""
    if not revision:
        raise UserError(
            "--revision is empty; the service must declare a revision that runs pin with "
            "rl.reward.revision, e.g. --revision builtin-v1"
        )
    server = RewardServer(host=host, port=port, revision=revision, token=token)
    try:
        url = server.start()
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc}); pick another --host/--port") from None
    stopped = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(
        f"reward service listening on {url} (revision {revision}, rewards {sorted(REWARDS)}, "
        f"token {'required' if token else 'not required'})",
        flush=True,
    )
    try:
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
