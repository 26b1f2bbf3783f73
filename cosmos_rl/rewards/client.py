"""HTTP client for a reward service speaking the protocol in `cosmos_rl.rewards.server`.

Transient failures (timeouts, 5xx, dropped connections, unparsable answers, a wrong number of
scores) are retried with exponential backoff; when the retries run out the client raises
`RewardServiceError`. Configuration mistakes (wrong token, unknown reward, revision mismatch)
raise `UserError` at once: retrying cannot fix them.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from cosmos_rl.errors import UserError
from cosmos_rl.rewards.functions import check_images


class RewardServiceError(RuntimeError):
    """The reward service could not be used (down, broken, or changed under a running job)."""


class _Transient(Exception):
    """A failure worth retrying."""


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def encode_png(image: np.ndarray) -> str:
    """One uint8 [H, W, 3] image -> base64 PNG (lossless, so the service scores exact pixels)."""
    buffer = io.BytesIO()
    # Fast compression: the bytes only cross loopback or a LAN, encode time matters more.
    Image.fromarray(image).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class RewardClient:
    """Scores images with one reward of one pinned-revision service."""

    def __init__(
        self,
        url: str,
        reward: str,
        expected_revision: str,
        timeout_s: float,
        max_retries: int,
        backoff_s: float,
        token: str | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise UserError(f"rl.reward.url must start with http:// or https://, got {url!r}")
        if not timeout_s > 0:
            raise UserError(f"rl.reward.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise UserError(f"rl.reward.max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0:
            raise UserError(f"rl.reward.backoff_s must be >= 0, got {backoff_s}")
        self.url = url.rstrip("/")
        self.reward = reward
        self.expected_revision = expected_revision
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.token = token or None

    # -- public API ----------------------------------------------------------------------
    def info(self) -> dict:
        """GET /info (with retries)."""
        return self._call("GET", "/info", None, _check_info)

    def check_revision(self) -> dict:
        """Refuse a service whose declared revision is missing or differs from the pin.

        Also refuses a service that does not offer `reward`. Returns the /info answer.
        """
        info = self.info()
        found = info.get("revision")
        if not self.expected_revision:
            raise UserError(
                f"rl.reward.revision is empty; pin the revision the service declares "
                f"(the service at {self.url} declares {found!r})"
            )
        if not found:
            raise UserError(
                f"the reward service at {self.url} declares no revision, so it cannot be pinned "
                f"(rl.reward.revision expects {self.expected_revision!r}); start the service "
                "with a revision"
            )
        if found != self.expected_revision:
            raise UserError(
                f"rl.reward.revision is {self.expected_revision!r} but the reward service at "
                f"{self.url} declares {found!r}; point rl.reward.url at the pinned service or "
                "update the pin"
            )
        if self.reward not in info["rewards"]:
            raise UserError(
                f"rl.reward.name is {self.reward!r} but the service at {self.url} offers "
                f"{info['rewards']}; pick one of those"
            )
        return info

    def score(self, images_uint8: np.ndarray, prompts: Sequence[str]) -> list[float]:
        """Scores for uint8 [N, H, W, 3] images, one per image, in order."""
        check_images(images_uint8, prompts)
        payload = {
            "reward": self.reward,
            "prompts": list(prompts),
            "images": [encode_png(image) for image in images_uint8],
        }
        n = len(prompts)
        answer = self._call("POST", "/score", payload, lambda a: _check_scores(a, n))
        if answer.get("revision") != self.expected_revision:
            raise RewardServiceError(
                f"reward service at {self.url} answered with revision "
                f"{answer.get('revision')!r}, not the pinned {self.expected_revision!r}; "
                "it changed under the running job"
            )
        return answer["scores"]

    # -- transport -----------------------------------------------------------------------
    def _call(
        self, method: str, path: str, payload: dict | None, check: Callable[[object], None]
    ) -> dict:
        attempts = self.max_retries + 1
        last_error = ""
        for attempt in range(attempts):
            try:
                answer = self._once(method, path, payload)
                check(answer)
                return answer
            except _Transient as exc:
                last_error = str(exc)
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * 2**attempt)
        raise RewardServiceError(
            f"reward service {method} {self.url}{path} failed {attempts} time(s), "
            f"giving up; last error: {last_error}"
        )

    def _once(self, method: str, path: str, payload: dict | None) -> object:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            self._raise_for_status(exc, method, path)
        except (urllib.error.URLError, TimeoutError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            kind = "timed out" if isinstance(reason, TimeoutError) else "connection failed"
            raise _Transient(f"{kind}: {_one_line(repr(reason))}") from None
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _Transient(f"answer is not JSON: {_one_line(repr(body[:80]))}") from None

    def _raise_for_status(self, exc: urllib.error.HTTPError, method: str, path: str):
        try:
            detail = json.loads(exc.read()).get("error", "")
        except Exception:  # the body is only decoration for the message
            detail = ""
        detail = _one_line(detail) or exc.reason
        if exc.code >= 500:
            raise _Transient(f"HTTP {exc.code}: {detail}") from None
        if exc.code in (401, 403):
            raise UserError(
                f"the reward service at {self.url} refused the bearer token (HTTP {exc.code}); "
                "set rl.reward.token_env to a variable holding the service's token"
            ) from None
        raise RewardServiceError(
            f"reward service {method} {self.url}{path} rejected the request "
            f"(HTTP {exc.code}): {detail}"
        ) from None


def _check_info(answer: object) -> None:
    if not isinstance(answer, dict) or not isinstance(answer.get("rewards"), list):
        raise _Transient(f"/info answer lacks a rewards list: {_one_line(repr(answer))}")


def _check_scores(answer: object, expected: int) -> None:
    if not isinstance(answer, dict) or not isinstance(answer.get("scores"), list):
        raise _Transient(f"/score answer lacks a scores list: {_one_line(repr(answer))}")
    scores = answer["scores"]
    if len(scores) != expected:
        raise _Transient(f"/score answered {len(scores)} scores for {expected} images")
    ok = all(
        isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s)
        for s in scores
    )
    if not ok:
        raise _Transient(f"/score answered non-finite or non-numeric scores: {_one_line(repr(scores))}")
    answer["scores"] = [float(s) for s in scores]
