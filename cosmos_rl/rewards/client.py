"""HTTP client for a reward service speaking the protocol in `cosmos_rl.rewards.app` (on `requests`).

Transient failures (timeouts, 5xx, dropped connections, unparsable answers, a wrong number of
scores) are retried with exponential backoff; when the retries run out the client raises
`RewardServiceError`. Every 4xx is final: a wrong token, an unknown reward or a revision mismatch
raise `UserError` at once, any other 4xx `RewardServiceError`; retrying cannot fix them.
Several rewards at once: `cosmos_rl.rewards.multi`.
"""

from __future__ import annotations

import base64
import io
import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import requests
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
    """Scores images with one reward of one pinned-revision service.

    `key` is the manifest table the settings came from (`rl.reward`, or `rl.rewards[1]`), so every
    message names the key to fix. `expected_reward_revision`, when set, also pins the reward's own
    revision from /info `revisions` (for a model reward it holds a hash of its weights).
    """

    def __init__(
        self,
        url: str,
        reward: str,
        expected_revision: str,
        timeout_s: float,
        max_retries: int,
        backoff_s: float,
        token: str | None = None,
        key: str = "rl.reward",
        expected_reward_revision: str = "",
    ):
        if not url.startswith(("http://", "https://")):
            raise UserError(f"{key}.url must start with http:// or https://, got {url!r}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise UserError(f"{key}.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise UserError(f"{key}.max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0:
            raise UserError(f"{key}.backoff_s must be >= 0, got {backoff_s}")
        self.url = url.rstrip("/")
        self.reward = reward
        self.expected_revision = expected_revision
        self.expected_reward_revision = expected_reward_revision
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.token = token or None
        self.key = key
        self._session: requests.Session | None = None

    # -- public API ----------------------------------------------------------------------
    def info(self) -> dict:
        """GET /info (with retries)."""
        return self._call("GET", "/info", None, _check_info)

    def check_revision(self) -> dict:
        """Refuse a service whose declared revision is missing or differs from the pin.

        Also refuses a service that does not offer `reward`, and, when a reward revision is
        pinned, one whose reward has another revision. Returns the /info answer.
        """
        info = self.info()
        found = info.get("revision")
        key = self.key
        if not self.expected_revision:
            raise UserError(
                f"{key}.revision is empty; pin the revision the service declares "
                f"(the service at {self.url} declares {found!r})"
            )
        if not found:
            raise UserError(
                f"the reward service at {self.url} declares no revision, so it cannot be pinned "
                f"({key}.revision expects {self.expected_revision!r}); start the service "
                "with a revision"
            )
        if found != self.expected_revision:
            raise UserError(
                f"{key}.revision is {self.expected_revision!r} but the reward service at "
                f"{self.url} declares {found!r}; point {key}.url at the pinned service or "
                "update the pin"
            )
        if self.reward not in info["rewards"]:
            raise UserError(
                f"{key}.name is {self.reward!r} but the service at {self.url} offers "
                f"{info['rewards']}; pick one of those"
            )
        if self.expected_reward_revision:
            own = (info.get("revisions") or {}).get(self.reward)
            if own != self.expected_reward_revision:
                raise UserError(
                    f"{key}.reward_revision is {self.expected_reward_revision!r} but the service at {self.url} "
                    f"declares {own!r} for {self.reward!r} (its weights changed, or it lists no revisions); "
                    "point the run at the pinned model or update the pin"
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
        own = answer.get("reward_revision")
        if self.expected_reward_revision and own is not None and own != self.expected_reward_revision:
            raise RewardServiceError(
                f"reward service at {self.url} scored {self.reward!r} with reward revision {own!r}, not the "
                f"pinned {self.expected_reward_revision!r}; it changed under the running job"
            )
        return answer["scores"]

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

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
                self.close()  # a fresh connection for the next try (the old one may be half-dead)
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * 2**attempt)
        raise RewardServiceError(
            f"reward service {method} {self.url}{path} failed {attempts} time(s), "
            f"giving up; last error: {last_error}"
        )

    def _once(self, method: str, path: str, payload: dict | None) -> object:
        if self._session is None:
            self._session = requests.Session()
            self._session.trust_env = False  # no proxy from the environment between us and the service
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self._session.request(method, self.url + path, json=payload, headers=headers, timeout=self.timeout_s)
            body = response.content
        except requests.Timeout as exc:
            raise _Transient(f"timed out: {_one_line(repr(exc))}") from None
        except requests.RequestException as exc:  # refused, reset, cut mid-answer
            raise _Transient(f"connection failed: {_one_line(repr(exc))}") from None
        if response.status_code >= 400:
            self._raise_for_status(response, method, path)
        try:
            return response.json()
        except ValueError:
            raise _Transient(f"answer is not JSON: {_one_line(repr(body[:80]))}") from None

    def _raise_for_status(self, response: requests.Response, method: str, path: str):
        try:
            detail = response.json().get("error", "")
        except Exception:  # the body is only decoration for the message
            detail = ""
        detail = _one_line(detail) or response.reason
        code = response.status_code
        if code >= 500:
            raise _Transient(f"HTTP {code}: {detail}") from None
        if code in (401, 403):
            raise UserError(
                f"the reward service at {self.url} refused the bearer token (HTTP {code}); "
                f"set {self.key}.token_env to a variable holding the service's token"
            ) from None
        raise RewardServiceError(
            f"reward service {method} {self.url}{path} rejected the request "
            f"(HTTP {code}): {detail}"
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
