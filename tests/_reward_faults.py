"""A reward service that misbehaves on purpose: the real server and app with faults queued for
/score, so tests exercise the client's retries against real HTTP (the shipped service has no
fault hooks; this subclass adds them).

Each /score request whose body arrived consumes one queued fault, in order:
  http_500         answer 500
  garbage          answer 200 with a body that is not JSON
  wrong_count      answer 200 with one score too few
  wrong_revision   answer 200 with a different revision than the service declares
  drop_connection  start a 200 answer and close the connection before its body
  delay:<seconds>  wait, then answer normally
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque

from starlette.responses import JSONResponse, Response

from cosmos_rl.rewards.app import RewardApp, ServiceState, _error
from cosmos_rl.rewards.server import RewardServer

FAULTS = ("http_500", "garbage", "wrong_count", "wrong_revision", "drop_connection")


def is_delay(fault: str) -> bool:
    if not fault.startswith("delay:"):
        return False
    try:
        return float(fault.split(":", 1)[1]) >= 0
    except ValueError:
        return False


class FaultState(ServiceState):
    """The service's counters plus the queued faults (thread-safe)."""

    def __init__(self):
        super().__init__()
        self._fault_lock = threading.Lock()
        self._faults: deque[str] = deque()

    def inject(self, *faults: str) -> None:
        for fault in faults:
            if fault not in FAULTS and not is_delay(fault):
                raise ValueError(f"unknown fault {fault!r}; use one of {FAULTS} or 'delay:<s>'")
        with self._fault_lock:
            self._faults.extend(faults)

    def next_fault(self) -> str | None:
        with self._fault_lock:
            return self._faults.popleft() if self._faults else None


class FaultyApp(RewardApp):
    """The reward app, answering each /score request as its queued fault says."""

    async def _answer(self, body: bytes) -> Response:
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
        answer = await super()._answer(body)
        if fault not in ("wrong_count", "wrong_revision") or answer.status_code != 200:
            return answer
        response = json.loads(answer.body)
        if fault == "wrong_count":
            response["scores"] = response["scores"][:-1]
        else:
            response["revision"] = f"{response['revision']}-other"
        return JSONResponse(response)


class FaultyRewardServer(RewardServer):
    """`RewardServer` whose /score answers follow `inject_faults`."""

    app_class = FaultyApp

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._state = FaultState()

    def inject_faults(self, *faults: str) -> None:
        """Queue faults for the next /score requests, one per request (see FAULTS)."""
        self._state.inject(*faults)


class _Dropped(Response):
    """Starts a 200 answer that promises a body, then ends without it: the client sees a cut connection."""

    def __init__(self):
        super().__init__(status_code=200)

    async def __call__(self, scope, receive, send) -> None:
        # uvicorn closes a connection whose answer the app left unfinished (and logs one line).
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
