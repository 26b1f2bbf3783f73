"""The reward service as one ASGI app (Starlette), the same under uvicorn and under Ray Serve.

Protocol (JSON over HTTP; with a token every endpoint needs `Authorization: Bearer <token>`, else 401):
    GET  /info  -> {"name": str, "revision": str | null, "rewards": [str, ...],
                    "revisions": {reward: its own revision, ...},
                    "modalities": {reward: ["image"] | ["video"] | ["image", "video"], ...},
                    "uses_prompt": {reward: bool, ...}}
    POST /score    {"reward": str, "prompts": [str, ...], "images": [base64 PNG (RGB), ...]}
             or    {"reward": str, "prompts": [str, ...], "clips": [[base64 PNG frame, ...], ...]}
                -> {"scores": [float, ...], "revision": str | null, "reward_revision": str}
Protocol 2 (/info `"protocol": 2`; a service without the key speaks 1, which has no action rows): a
reward that scores each sample's action rows (a world model's generated actions: `Reward.takes_actions`)
is listed in /info `"action_rewards": [reward, ...]` (the key is there only when some reward is) and its
/score request carries `"actions": [[[float, ...], ...], ...]`, one list of rows per prompt, every
sample the same row count, every row the same width (at most `limits.MAX_ACTION_WIDTH`) of finite
numbers, in the embodiment's own units (Push-T: world units); a request to it without `actions`, or
`actions` sent to any other reward, is a 400. Requests to other rewards are protocol 1's, unchanged.
A reward with named dimensions (`rewards.dimensions`) is listed in /info `"dimensions": {reward: [name, ...]}`
(the key is there only when some reward has dimensions) and its /score answer adds
`"dimensions": {name: [float, ...]}`, one value per prompt each; other answers are unchanged.
A reward takes `images` if its modalities list `image`, `clips` (one list of frames per prompt, every
clip of a request with the same frame count and size) if they list `video`. A service whose /info
has no `modalities` counts as image-only, and one with no `uses_prompt` as reading every prompt.
Errors come back as {"error": message}: 400 malformed field, 401 token, 404 path, 405 method,
411 no Content-Length, 413 over a limit, 500 reward bug, 503 busy or over time (retry).

Order of checks on /score, so that a hostile request costs little: the token (from the headers,
before a byte of the body is read), the declared body size, the in-flight byte budget, the body
(read under a deadline), the fields (a clip's frame count from its list's length), each PNG's
header (side, pixels), the decoded size against the budget, and only then decoding and scoring.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cosmos_rl.rewards.batching import Batcher, RewardError
from cosmos_rl.rewards.dimensions import Scored
from cosmos_rl.rewards.limits import (
    BadRequest, Fields, Limits, decode, decoded_bytes, library_said, open_images, parse_fields,
)  # fmt: skip
from cosmos_rl.rewards.registry import Reward

log = logging.getLogger(__name__)

SERVICE_NAME = "cosmos-rl-builtin"
PROTOCOL = 2  # 2: action rows (`actions`) for the rewards /info lists in `action_rewards`; 1 had neither

class ServiceState:
    """Counters shared between the app and whoever hosts it (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.score_requests = 0

    def count_score(self) -> None:
        """One more /score request whose body arrived (scored or not)."""
        with self._lock:
            self.score_requests += 1


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
        # No 307 from `/score/` to `/score`: a redirect would answer before the token check (and
        # tell a client without the token which paths exist); every other path is a 404 after it.
        self.asgi.router.redirect_slashes = False

    def info(self) -> dict:
        names = sorted(self.registry)
        answer = {
            "name": self.name,
            "revision": self.revision,
            "rewards": names,
            "revisions": {name: self.registry[name].revision for name in names},
            "modalities": {name: list(self.registry[name].modalities) for name in names},
            "uses_prompt": {name: self.registry[name].uses_prompt for name in names},
            "protocol": PROTOCOL,
        }
        takes = [name for name in names if self.registry[name].takes_actions]
        if takes:  # absent when no reward takes action rows
            answer["action_rewards"] = takes
        dimensions = {name: list(self.registry[name].dimensions) for name in names if self.registry[name].dimensions}
        if dimensions:  # absent when no reward has any, so such a service's /info is what it was
            answer["dimensions"] = dimensions
        return answer

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
            self.state.count_score()
            return await self._answer(body)
        finally:
            self._budget.give(length)

    async def _answer(self, body: bytes) -> Response:
        """The answer to a /score request whose body arrived within the limits."""
        try:
            response = await self._scored(body)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        return JSONResponse(response)

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
        fields, opened = await loop.run_in_executor(self._decode_pool, self._prepare, body)
        reward, prompts = fields.reward, fields.prompts
        need = decoded_bytes(opened)
        if not self._budget.take(need):
            raise BadRequest(f"decoding would need {need} bytes beyond the service's in-flight budget; retry shortly", 503)
        try:
            pixels = await loop.run_in_executor(self._decode_pool, decode, opened, fields.label)
            if fields.frames is not None:  # [N * F, H, W, 3] -> [N, F, H, W, 3], a view
                pixels = pixels.reshape(len(prompts), fields.frames, *pixels.shape[1:])
            batcher = self._batchers.get(reward)
            if batcher is None:
                batcher = self._batchers[reward] = Batcher(self.registry[reward], self.batch_wait_s)
            try:
                scores = await asyncio.wait_for(batcher.score(pixels, prompts, fields.actions), self.limits.score_timeout_s)
            except asyncio.TimeoutError:
                raise BadRequest(f"scoring took over {self.limits.score_timeout_s:g} s; retry", 503) from None
            except RewardError as exc:
                if not exc.bad_input:
                    log.error("reward %s failed: %s", reward, exc)
                raise BadRequest(str(exc), 400 if exc.bad_input else 500) from None
        finally:
            self._budget.give(need)
        answer = {"scores": scores, "revision": self.revision, "reward_revision": self.registry[reward].revision}
        if isinstance(scores, Scored):
            answer["scores"], answer["dimensions"] = scores.scores, scores.dimensions
        return answer

    def _prepare(self, body: bytes) -> tuple[Fields, list]:
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"body is not JSON: {library_said(exc)}") from None
        except RecursionError:  # the parser's own bound on nesting: the client's input, not a bug
            raise BadRequest("body is JSON nested too deeply; the /score body is an object of flat lists") from None
        except ValueError as exc:  # e.g. an integer over Python's 4300-digit conversion limit
            raise BadRequest(f"body holds a value this service does not read: {library_said(exc)}") from None
        modalities = {name: reward.modalities for name, reward in self.registry.items()}
        takes = [name for name, reward in self.registry.items() if reward.takes_actions]
        fields = parse_fields(request, modalities, self.limits, takes)
        return fields, open_images(fields.encoded, self.limits, fields.label, "images" if fields.frames is None else "frames")
