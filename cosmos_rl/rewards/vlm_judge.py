"""A VLM judge as a reward: an OpenAI-compatible chat server (vLLM, SGLang) asked, sample by sample,
to score an image or a few frames of a clip; the score is read from its answer by a regex.

The run names it with a `judge` table under its reward table (`[rl.reward.judge]`, or
`[rl.rewards.judge]` after a `[[rl.rewards]]`; docs/judge.md): the reward's `url`
is the server's API root (`http://HOST:8000/v1`), `judge.model` the model it serves. For each
sample the client POSTs `{url}/chat/completions`:

    {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS,
     "messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},   # one per frame
         {"type": "text", "text": PROMPT with {prompt} replaced by the sample's caption}]}]}

An image is sent as itself; a clip as `judge.frames` frames evenly spaced from its first to its
last (`sampled_frames`), all in one message. The answer's `choices[0].message.content` is searched
with `judge.score_regex`; its first capture group is the score (a number), which must lie in
`judge.score_range` (inclusive). Up to `judge.concurrency` samples are in flight at once.

Failures never become a score: an answer the regex does not match, a group that is not a number,
a score outside the range or an answer without the content raise `RewardServiceError` at once,
one line naming the reward's table, the sample (its index and caption) and what came back
(escaped, cut at 200 characters); a timeout, a dropped connection or an HTTP 5xx is retried
(`max_retries`, `backoff_s`, doubling) and then raises the same way. HTTP 401/403 is a `UserError`
(set `token_env`). A judge at temperature 0 answers the same again, so an unparsable answer is
not retried.

`check_revision` (before training) asks `GET {url}/models` and refuses a server that does not
serve `judge.model`; the reward's `revision` is the run's own label for the judge (the chat API
declares none), kept in the run identity.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.rewards.client import RewardServiceError, encode_png
from cosmos_rl.rewards.functions import check_images
from cosmos_rl.rewards.video import check_clips

SHOWN = 200  # characters of an answer a message shows


def sampled_frames(num_frames: int, count: int) -> list[int]:
    """`count` frame indices evenly spaced from the first to the last (rounded; repeats dropped):
    17 frames, count 3 -> [0, 8, 16]; count 1 -> [0]."""
    if count < 1:
        raise ValueError(f"frames must be >= 1, got {count}")
    picked = np.linspace(0, num_frames - 1, min(count, num_frames)).round().astype(int)
    return sorted(set(int(i) for i in picked))


def _shown(text: object) -> str:
    """What came back, escaped (repr: newlines, quotes and control characters visible), cut."""
    text = text if isinstance(text, str) else repr(text)
    return repr(text[:SHOWN]) + ("..." if len(text) > SHOWN else "")


def parse_score(answer: str, pattern: re.Pattern, lo: float, hi: float) -> float:
    """The score in `answer`: the first capture group of `pattern`'s first match, a finite number in
    [lo, hi]; ValueError saying which of those failed."""
    found = pattern.search(answer)
    if found is None:
        raise ValueError(f"score_regex {pattern.pattern!r} does not match the answer")
    text = found.group(1)
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"score_regex's group 1 is {text!r}, not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"score_regex's group 1 is {text!r}, not a finite number")
    if not lo <= value <= hi:
        raise ValueError(f"score {value:g} is outside score_range [{lo:g}, {hi:g}]")
    return value


class _Transient(Exception):
    """A failure worth retrying (timeout, connection, HTTP 5xx)."""


class VLMJudgeClient:
    """Scores images or clips with a VLM judge; the interface of `RewardClient` (`reward`, `score`,
    `check_revision`, `close`) so `MultiRewardClient` and the trainer use it unchanged."""

    def __init__(self, url: str, reward: str, judge, timeout_s: float, max_retries: int, backoff_s: float,
                 token: str | None = None, key: str = "rl.reward"):  # fmt: skip
        if not url.startswith(("http://", "https://")):
            raise UserError(f"{key}.url must start with http:// or https:// (a VLM judge's API root, e.g. http://127.0.0.1:8000/v1), got {url!r}")
        try:
            self.pattern = re.compile(judge.score_regex)
        except re.error as exc:
            raise UserError(f"{key}.judge.score_regex {judge.score_regex!r} is not a regular expression ({exc}); fix it") from None
        if self.pattern.groups < 1:
            raise UserError(f"{key}.judge.score_regex {judge.score_regex!r} has no capture group; put the number in one, e.g. 'Score:\\s*([0-9.]+)'")
        self.url, self.reward, self.judge, self.key = url.rstrip("/"), reward, judge, key
        self.lo, self.hi = (float(v) for v in judge.score_range)
        self.timeout_s, self.max_retries, self.backoff_s, self.token = timeout_s, max_retries, backoff_s, token or None
        self._pool = ThreadPoolExecutor(max_workers=max(1, judge.concurrency), thread_name_prefix="vlm-judge")

    # -- the RewardClient interface --------------------------------------------------------
    def check_revision(self, media: MediaSpec) -> dict:
        """GET {url}/models: the server must serve `judge.model` (it judges images and clips alike)."""
        answer = self._request("GET", "/models", None, "the model list")
        served = [m.get("id") for m in answer.get("data", []) if isinstance(m, dict)] if isinstance(answer, dict) else []
        if self.judge.model not in served:
            raise UserError(
                f"{self.key}.judge.model: the judge at {self.url} serves {served}, not {self.judge.model!r}; "
                f"name one of those, or serve {self.judge.model!r} there (docs/judge.md)"
            )
        return {"models": served}

    def score(self, images_or_clips: np.ndarray, prompts: Sequence[str], per_frame_prompts=None) -> list[float]:
        """One score per image [N, H, W, 3] or clip [N, F, H, W, 3], in order (`per_frame_prompts`
        plays no part: the judge sees a clip's frames against the clip's own caption)."""
        samples = np.asarray(images_or_clips)
        if samples.ndim == 5:
            check_clips(samples, prompts)
            picked = sampled_frames(samples.shape[1], self.judge.frames)
            frame_sets = [[clip[i] for i in picked] for clip in samples]
        else:
            check_images(samples, prompts)
            frame_sets = [[image] for image in samples]
        futures = [self._pool.submit(self._judge, n, frames, prompt) for n, (frames, prompt) in enumerate(zip(frame_sets, prompts))]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    # -- one sample --------------------------------------------------------------------------
    def _judge(self, index: int, frames: list[np.ndarray], caption: str) -> float:
        text = self.judge.prompt.replace("{prompt}", caption)
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encode_png(f)}"}} for f in frames]
        payload = {
            "model": self.judge.model, "temperature": 0, "max_tokens": self.judge.max_tokens,
            "messages": [{"role": "user", "content": [*content, {"type": "text", "text": text}]}],
        }  # fmt: skip
        where = f"sample {index} (prompt {caption[:80]!r})"
        answer = self._request("POST", "/chat/completions", payload, where)
        try:
            said = answer["choices"][0]["message"]["content"]
            if not isinstance(said, str):
                raise TypeError
        except (KeyError, IndexError, TypeError):
            raise RewardServiceError(f"{self.key} (VLM judge {self.judge.model} at {self.url}): {where}: the answer has no "
                                     f"choices[0].message.content; it was {_shown(answer)}") from None  # fmt: skip
        try:
            return parse_score(said, self.pattern, self.lo, self.hi)
        except ValueError as exc:
            raise RewardServiceError(
                f"{self.key} (VLM judge {self.judge.model} at {self.url}): {where}: {exc}; the judge answered {_shown(said)}; "
                f"fix {self.key}.judge.prompt or {self.key}.judge.score_regex / score_range"
            ) from None

    def _request(self, method: str, path: str, payload: dict | None, what: str) -> object:
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(attempts):
            try:
                return self._once(method, path, payload)
            except _Transient as exc:
                last = str(exc)
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * 2**attempt)
        raise RewardServiceError(
            f"{self.key} (VLM judge {self.judge.model} at {self.url}): {what}: {method} {path} failed {attempts} time(s), "
            f"giving up; last error: {last}"
        )

    def _once(self, method: str, path: str, payload: dict | None) -> object:
        headers = {"Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        session = requests.Session()
        session.trust_env = False  # no proxy from the environment between us and the judge
        try:
            response = session.request(method, self.url + path, json=payload, headers=headers, timeout=self.timeout_s)
            body = response.content
        except requests.Timeout:
            raise _Transient(f"no answer within {self.timeout_s:g} s ({self.key}.timeout_s)") from None
        except requests.RequestException as exc:
            raise _Transient(f"connection failed: {type(exc).__name__}") from None
        finally:
            session.close()
        if response.status_code in (401, 403):
            raise UserError(f"the VLM judge at {self.url} refused the bearer token (HTTP {response.status_code}); "
                            f"set {self.key}.token_env to a variable holding the server's API key")  # fmt: skip
        if response.status_code >= 500:
            raise _Transient(f"HTTP {response.status_code}: {_shown(body.decode('utf-8', 'replace'))}")
        if response.status_code >= 400:
            raise RewardServiceError(f"{self.key} (VLM judge {self.judge.model} at {self.url}): {method} {path} rejected "
                                     f"(HTTP {response.status_code}): {_shown(body.decode('utf-8', 'replace'))}")  # fmt: skip
        try:
            return response.json()
        except ValueError:
            raise _Transient(f"the answer is not JSON: {_shown(body.decode('utf-8', 'replace'))}") from None
