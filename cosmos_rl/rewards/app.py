"""The reward service as one ASGI app (Starlette), the same under uvicorn and under Ray Serve.

Protocol (JSON over HTTP; with a token every endpoint needs `Authorization: Bearer <token>`, else 401):
    GET  /info  -> {"name": str, "revision": str | null, "rewards": [str, ...],
                    "revisions": {reward: its own revision, ...}}
    POST /score    {"reward": str, "prompts": [str, ...], "images": [base64 PNG (RGB), ...]}
                -> {"scores": [float, ...], "revision": str | null, "reward_revision": str}
Errors come back as {"error": message}: 400 malformed field, 401 token, 404 path, 405 method,
411 no Content-Length, 413 over a limit, 500 reward bug, 503 busy or over time (retry).

Order of checks on /score, so that a hostile request costs little: the token (from the headers,
before a byte of the body is read), the declared body size, the in-flight byte budget, the body
(read under a deadline), the fields, each PNG's header (side, pixels), the decoded size against
the budget, and only then decoding and scoring.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cosmos_rl.rewards.batching import Batcher, RewardError
from cosmos_rl.rewards.limits import BadRequest, Limits, decode, decoded_bytes, open_images, parse_fields
from cosmos_rl.rewards.registry import Reward

log = logging.getLogger(__name__)

SERVICE_NAME = "cosmos-rl-builtin"

# Faults a test can queue for /score; each request (after its body is read) consumes one, in order.
#   http_500         answer 500
#   garbage          answer 200 with a body that is not JSON
#   wrong_count      answer 200 with one score too few
#   wrong_revision   answer 200 with a different revision than the service declares
#   drop_connection  start a 200 answer and close the connection before its body
#   delay:<seconds>  wait, then answer normally
FAULTS = ("http_500", "garbage", "wrong_count", "wrong_revision", "drop_connection")


def is_delay(fault: str) -> bool:
    if not fault.startswith("delay:"):
        return False
    try:
        return float(fault.split(":", 1)[1]) >= 0
    except ValueError:
        return False


class ServiceState:
    """Counters and queued faults, shared between the app and whoever hosts it (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._faults: deque[str] = deque()
        self.score_requests = 0

    def inject(self, *faults: str) -> None:
        for fault in faults:
            if fault not in FAULTS and not is_delay(fault):
                raise ValueError(f"unknown fault {fault!r}; use one of {FAULTS} or 'delay:<s>'")
        with self._lock:
            self._faults.extend(faults)

    def next_fault(self) -> str | None:
        with self._lock:
            self.score_requests += 1
            return self._faults.popleft() if self._faults else None


class _Budget:
    """Bytes held by requests in flight (bodies, then decoded pixels); over it answers 503."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


def _error(status: int, message: str, close: bool = False, headers: dict | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if close:  # the body was not read: do not leave it for the next request on this connection
        headers["Connection"] = "close"
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class RewardApp:
    """The registry, limits, token and batchers behind one Starlette app (`.asgi`)."""

    def __init__(
        self,
        registry: dict[str, Reward],
        revision: str | None,
        token: str | None = None,
        limits: Limits | None = None,
        state: ServiceState | None = None,
        name: str = SERVICE_NAME,
        batch_wait_s: float = 0.005,
    ):
        self.registry = registry
        self.revision = revision
        self.token = token or None
        self.limits = limits or Limits()
        self.state = state or ServiceState()
        self.name = name
        self.batch_wait_s = batch_wait_s
        self._budget = _Budget(self.limits.max_inflight_bytes)
        self._decode_pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="reward-decode")
        self._batchers: dict[str, Batcher] = {}
        self.asgi = Starlette(
            routes=[Route("/info", self._info, methods=["GET"]), Route("/score", self._score, methods=["POST"])],
            exception_handlers={HTTPException: self._http_error},
        )

    def info(self) -> dict:
        return {
            "name": self.name,
            "revision": self.revision,
            "rewards": sorted(self.registry),
            "revisions": {name: self.registry[name].revision for name in sorted(self.registry)},
        }

    def close(self) -> None:
        for batcher in self._batchers.values():
            batcher.close()
        self._decode_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------ endpoints
    def _refused(self, request: Request) -> Response | None:
        if self.token is None:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return None
        return _error(401, "missing or wrong bearer token", close=True, headers={"WWW-Authenticate": "Bearer"})

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        hint = "GET /info or POST /score"
        if exc.status_code == 405:
            return _error(405, f"{request.method} {request.url.path} is not allowed; use {hint}", close=True)
        return _error(exc.status_code, f"no such endpoint {request.url.path}; use {hint}", close=True)

    async def _info(self, request: Request) -> Response:
        return self._refused(request) or JSONResponse(self.info())

    async def _score(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        length_header = request.headers.get("content-length")
        if length_header is None:
            return _error(411, "send a Content-Length header (chunked bodies are not accepted)", close=True)
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            return _error(400, f"Content-Length must be a non-negative integer, got {length_header!r}", close=True)
        if length > self.limits.max_body_bytes:
            return _error(413, f"body of {length} bytes is over the limit of {self.limits.max_body_bytes}; split the request", close=True)
        if not self._budget.take(length):
            return _error(503, "the service is holding its in-flight byte budget; retry shortly", close=True)
        try:
            try:
                body = await asyncio.wait_for(self._read(request, length), self.limits.body_timeout_s)
            except asyncio.TimeoutError:
                return _error(408, f"the body did not arrive within {self.limits.body_timeout_s:g} s", close=True)
            except ClientDisconnect:
                return Response(status_code=400)
            fault = self.state.next_fault()
            if fault is not None and is_delay(fault):
                await asyncio.sleep(float(fault.split(":", 1)[1]))
                fault = None
            if fault == "http_500":
                return _error(500, "injected fault: http_500")
            if fault == "garbage":
                return Response(b"<html>this is not json", status_code=200, media_type="application/json")
            if fault == "drop_connection":
                return _Dropped()
            try:
                response = await self._scored(body)
            except BadRequest as exc:
                return _error(exc.status, str(exc))
            if fault == "wrong_count":
                response["scores"] = response["scores"][:-1]
            elif fault == "wrong_revision":
                response["revision"] = f"{response['revision']}-other"
            return JSONResponse(response)
        finally:
            self._budget.give(length)

    async def _read(self, request: Request, length: int) -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > length:  # the framing layer enforces Content-Length; this is belt and braces
                raise BadRequest("body is longer than its Content-Length")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _scored(self, body: bytes) -> dict:
        loop = asyncio.get_running_loop()
        reward, prompts, opened = await loop.run_in_executor(self._decode_pool, self._prepare, body)
        need = decoded_bytes(opened)
        if not self._budget.take(need):
            raise BadRequest(f"decoding would need {need} bytes beyond the service's in-flight budget; retry shortly", 503)
        try:
            images = await loop.run_in_executor(self._decode_pool, decode, opened)
            batcher = self._batchers.get(reward)
            if batcher is None:
                batcher = self._batchers[reward] = Batcher(self.registry[reward], self.batch_wait_s)
            try:
                scores = await asyncio.wait_for(batcher.score(images, prompts), self.limits.score_timeout_s)
            except asyncio.TimeoutError:
                raise BadRequest(f"scoring took over {self.limits.score_timeout_s:g} s; retry", 503) from None
            except RewardError as exc:
                if not exc.bad_input:
                    log.error("reward %s failed: %s", reward, exc)
                raise BadRequest(str(exc), 400 if exc.bad_input else 500) from None
        finally:
            self._budget.give(need)
        return {"scores": scores, "revision": self.revision, "reward_revision": self.registry[reward].revision}

    def _prepare(self, body: bytes):
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        reward, prompts, encoded = parse_fields(request, list(self.registry), self.limits)
        return reward, prompts, open_images(encoded, self.limits)


class _Dropped(Response):
    """Starts a 200 answer that promises a body, then ends without it: the client sees a cut connection."""

    def __init__(self):
        super().__init__(status_code=200)

    async def __call__(self, scope, receive, send) -> None:
        # uvicorn closes a connection whose answer the app left unfinished (and logs one line).
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
