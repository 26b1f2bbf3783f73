"""HTTP client for a reward service speaking the protocol in `cosmos_rl.rewards.app` (on `requests`).

Transient failures (timeouts, 5xx, dropped connections, unparsable answers, a wrong number of
scores) are retried with exponential backoff; when the retries run out the client raises
`RewardServiceError`. Every 4xx is final: a wrong token, an unknown reward or a revision mismatch
raise `UserError` at once, any other 4xx `RewardServiceError`; retrying cannot fix them.
Several rewards at once: `cosmos_rl.rewards.multi`.

Clips ([N, F, H, W, 3]) go to a reward whose /info modalities list `video` as they are; any other
reward (an image reward, or any reward of a service whose /info lists no modalities) scores them
frame by frame: the client sends the frames `frame_stride` picks as images, against each clip's
per-frame prompt, and reduces each clip's frame scores by `frame_reduce` (`cosmos_rl.rewards.frames`).
"""

from __future__ import annotations

import base64
import io
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.rewards import dimensions, frames
from cosmos_rl.rewards.functions import check_images
from cosmos_rl.rewards.limits import Limits, chunks_within
from cosmos_rl.rewards.video import check_clips

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)
# The limits the client keeps each clip or frame request within: the protocol's defaults.
WIRE_LIMITS = Limits()


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
        frame_reduce: str = "mean",
        frame_stride: int = 1,
        dimension_weights: dict[str, float] | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise UserError(f"{key}.url must start with http:// or https://, got {url!r}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise UserError(f"{key}.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise UserError(f"{key}.max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0:
            raise UserError(f"{key}.backoff_s must be >= 0, got {backoff_s}")
        try:
            frames.check_frame_settings(frame_reduce, frame_stride)
        except ValueError as exc:
            raise UserError(f"{key}: {exc}") from None
        self.url = url.rstrip("/")
        self.reward = reward
        self.expected_revision = expected_revision
        self.expected_reward_revision = expected_reward_revision
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.token = token or None
        self.key = key
        # The fix a refused token's message names: the manifest key, or a command's option (`evaluation.served`).
        self.token_fix = f"set {key}.token_env to a variable holding the service's token"
        self.frame_reduce, self.frame_stride = frame_reduce, frame_stride
        # {dimension: weight}: the score is the weighted sum of these named dimensions instead of the reward's own
        self.dimension_weights = dict(dimension_weights or {})
        self._session: requests.Session | None = None
        self._modalities: tuple[str, ...] | None = None  # the reward's, from /info (once known)
        self._listed = False  # whether /info listed modalities at all
        self._uses_prompt = True
        self._dimensions: tuple[str, ...] = ()  # the reward's named dimensions, from /info
        self._takes_actions = False  # /info (protocol 2) lists the reward in action_rewards: requests carry each sample's rows

    # -- public API ----------------------------------------------------------------------
    def info(self) -> dict:
        """GET /info (with retries)."""
        return self._call("GET", "/info", None, _check_info)

    def check_revision(self, media: MediaSpec) -> dict:
        """Refuse a service whose declared revision is missing or differs from the pin.

        Also refuses a service that does not offer `reward`, one whose reward has another revision
        when that is pinned, and one whose reward cannot score what the run makes (`media`, the run's):
        an image run needs a reward that takes images; a video run scores clips with an image-only
        reward frame by frame, and says so in the log. Returns the /info answer.
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
        self._learn(info)
        self._check_modality(media)
        missing = sorted(set(self.dimension_weights) - set(self._dimensions))
        if missing:
            raise UserError(f"{key}.dimensions names {missing}, which the service at {self.url} does not list for {self.reward!r} "
                            f"(it lists {list(self._dimensions)}); use those names, or clear {key}.dimensions")  # fmt: skip
        return info

    def clip_scoring(self) -> str:
        """How this client scores clips with its reward, in one sentence (after /info was read)."""
        if self._modalities is None:
            return f"{self.key} ({self.reward!r}): /info not read yet"
        if "video" in self._modalities:
            return f"{self.key}: the service at {self.url} scores whole clips with {self.reward!r} (modalities {list(self._modalities)})"
        why = f"its modalities are {list(self._modalities)}" if self._listed else "its /info lists no modalities, so it counts as image-only"
        k = self.frame_stride
        picked = {"first": "frame 0 alone", "last": "the last frame alone"}.get(
            self.frame_reduce, f"the {self.frame_reduce} over " + ("every frame" if k == 1 else f"frames 0, {k}, {2 * k}, ..."))
        return (f"{self.key}: {self.reward!r} at {self.url} is an image reward ({why}): each clip is scored frame by frame "
                f"({picked}; {self.key}.frame_reduce, {self.key}.frame_stride)")

    def _learn(self, info: dict) -> None:
        """The reward's modalities and prompt use from an /info answer (absent: image-only, prompted)."""
        listed = info.get("modalities")
        self._listed = isinstance(listed, dict) and self.reward in listed
        own = listed[self.reward] if self._listed else ["image"]
        if not (isinstance(own, list) and own and all(m in ("image", "video") for m in own)):
            raise UserError(f"the reward service at {self.url} lists modalities {_one_line(repr(own))} for {self.reward!r}; "
                            'a reward\'s modalities are a non-empty list of "image" and "video": fix the service')
        uses = info.get("uses_prompt")
        self._uses_prompt = not (isinstance(uses, dict) and uses.get(self.reward) is False)
        dims = info.get("dimensions")
        named = dims.get(self.reward, []) if isinstance(dims, dict) else []
        if not (isinstance(named, list) and all(isinstance(d, str) and d for d in named) and len(set(named)) == len(named)):
            raise UserError(f"the reward service at {self.url} lists dimensions {_one_line(repr(named))} for {self.reward!r}; "
                            "a reward's dimensions are a list of distinct names: fix the service")
        self._dimensions = tuple(named)
        takes = info.get("action_rewards")
        self._takes_actions = isinstance(takes, list) and self.reward in takes
        self._modalities = tuple(own)

    def dimensions(self) -> tuple[str, ...]:
        """The named dimensions the service lists for the reward in /info (read once); () for most rewards."""
        if self._modalities is None:
            self._learn(self.info())
        return self._dimensions

    def _check_modality(self, media: MediaSpec) -> None:
        mods = list(self._modalities)
        if not media.is_video:
            if "image" not in mods:
                raise UserError(f"{self.key}.name is {self.reward!r}, which the service at {self.url} scores as whole clips only "
                                f"(modalities {mods}), but this run makes images (model.num_frames = 1); pick an image reward")
            return
        if "video" not in mods:
            log.warning("%s", self.clip_scoring())
            return
        if (self.frame_reduce, self.frame_stride) != frames.DEFAULT_SETTINGS:
            raise UserError(f"{self.key}.frame_reduce / {self.key}.frame_stride play no part: the service at {self.url} scores "
                            f"whole clips with {self.reward!r} itself (modalities {mods}); remove them")

    def score(self, images_or_clips: np.ndarray, prompts: Sequence[str], per_frame_prompts: frames.PerFramePrompts = None) -> list[float]:
        """Scores for uint8 images [N, H, W, 3] or clips [N, F, H, W, 3], one per sample, in order
        (`score_dimensions` without the dimensions)."""
        return self.score_dimensions(images_or_clips, prompts, per_frame_prompts)[0]

    def score_dimensions(
        self, images_or_clips: np.ndarray, prompts: Sequence[str], per_frame_prompts: frames.PerFramePrompts = None,
        actions: np.ndarray | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """(scores, {dimension: values}) for uint8 images [N, H, W, 3] or clips [N, F, H, W, 3], one per
        sample, in order; the dimensions are those the reward's answers carry ({} for most rewards). With
        `dimension_weights` the scores are the weighted sum of those dimensions. `actions` [N, rows, width]:
        each clip's action rows, sent (protocol 2) when /info lists the reward in `action_rewards` and
        required then; a reward that takes none is sent none (a run's other rewards score its clips alone).
        """
        scores, dims = self._score_dimensions(images_or_clips, prompts, per_frame_prompts, actions)
        if not self.dimension_weights:
            return scores, dims
        missing = sorted(set(self.dimension_weights) - set(dims))
        if missing:
            raise RewardServiceError(f"reward service at {self.url} answered {self.reward!r} without dimensions {missing} "
                                     f"that {self.key}.dimensions weighs; it changed under the running job")  # fmt: skip
        weighted = [sum(w * dims[d][i] for d, w in sorted(self.dimension_weights.items())) for i in range(len(scores))]
        return [float(v) for v in weighted], dims

    def _score_dimensions(
        self, images_or_clips: np.ndarray, prompts: Sequence[str], per_frame_prompts: frames.PerFramePrompts = None,
        actions: np.ndarray | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """`score_dimensions` before the dimension weights.

        An image reward scores a clip frame by frame against the clip's per-frame prompt:
        `per_frame_prompts` is one per clip (a list) or a function of the clip's prompt (None where a
        caption has no per-frame form), else the clip's own prompt. A reward that reads its prompt
        refuses a clip whose per-frame prompt is None (UserError naming the reward and caption).
        """
        if isinstance(images_or_clips, np.ndarray) and images_or_clips.ndim == 5:
            return self._score_clips(images_or_clips, prompts, per_frame_prompts, actions)
        if per_frame_prompts is not None:
            raise ValueError("per_frame_prompts is for clips [N, F, H, W, 3]; these are images")
        check_images(images_or_clips, prompts)
        return self._post("images", [encode_png(image) for image in images_or_clips], list(prompts))

    def _joined(self, field: str, items: list, prompts: list[str], sizes: list,
                actions: np.ndarray | None = None) -> tuple[list[float], dict[str, list[float]]]:  # fmt: skip
        """One /score request per chunk within the wire limits, the answers joined in order."""
        scores, dims = [], {}
        for a, b in chunks_within(sizes, WIRE_LIMITS):
            part, part_dims = self._post(field, items[a:b], prompts[a:b], None if actions is None else actions[a:b])
            if a and sorted(part_dims) != sorted(dims):
                raise RewardServiceError(f"reward service at {self.url} answered dimensions {sorted(part_dims)} after {sorted(dims)} "
                                         "for the same reward; it changed under the running job")  # fmt: skip
            scores += part
            for name, values in part_dims.items():
                dims.setdefault(name, []).extend(values)
        return scores, dims

    def _score_clips(
        self, clips: np.ndarray, prompts: Sequence[str], per_frame_prompts: frames.PerFramePrompts, actions: np.ndarray | None = None
    ) -> tuple[list[float], dict[str, list[float]]]:
        check_clips(clips, prompts)
        if self._modalities is None:
            self._learn(self.info())
        n, f, h, w = clips.shape[:4]
        rows = self._action_rows(actions, n) if self._takes_actions else None
        if "video" in self._modalities:
            encoded = [[encode_png(frame) for frame in clip] for clip in clips]
            sizes = [(f, f * h * w, sum(map(len, clip)) + len(p)) for clip, p in zip(encoded, prompts)]
            return self._joined("clips", encoded, list(prompts), sizes, rows)
        if rows is not None:
            raise UserError(f"{self.key}: {self.reward!r} at {self.url} scores action rows and takes no clips (its modalities are "
                            f"{list(self._modalities)}); fix the service: an action reward scores whole clips")
        picked = frames.scored_frames(f, self.frame_reduce, self.frame_stride)
        texts = frames.frame_prompts(prompts, per_frame_prompts)
        if self._uses_prompt:
            for prompt, text in zip(prompts, texts):
                if text is None:
                    raise UserError(
                        f"{self.key}: {self.reward!r} scores clips frame by frame against a per-frame caption, and caption "
                        f"{_one_line(repr(prompt))} has none; score such prompts with a reward that scores whole clips "
                        "(e.g. shapes_video_strict) or one that reads no prompt (brightness, aesthetic), or leave them out"
                    )
        encoded = [encode_png(clips[i, j]) for i in range(n) for j in picked]
        flat = [text or "" for text in texts for _ in picked]
        sizes = [(1, h * w, len(e) + len(p)) for e, p in zip(encoded, flat)]
        scores, dims = self._joined("images", encoded, flat, sizes)
        k = len(picked)

        def per_clip(values: list[float]) -> list[float]:
            return [frames.reduce_scores(values[i * k : (i + 1) * k], self.frame_reduce) for i in range(n)]

        # an image reward's dimensions reduce over a clip's frames as its score does
        return per_clip(scores), {name: per_clip(values) for name, values in dims.items()}

    def _action_rows(self, actions: np.ndarray | None, count: int) -> np.ndarray:
        """The rows an action reward's request carries, checked: finite float [count, rows >= 1, width >= 1]."""
        if actions is None:
            raise UserError(f"{self.key}.name is {self.reward!r}, which scores each clip's generated action rows, and this run "
                            "generates none; use it in a policy-mode run (model.condition.kind = \"policy\")")
        rows = np.asarray(actions, dtype=np.float64)
        if rows.ndim != 3 or rows.shape[0] != count or 0 in rows.shape or not np.isfinite(rows).all():
            raise ValueError(f"action rows must be finite [N={count}, rows, width], got {list(rows.shape)}")
        return rows

    def _post(self, field: str, items: list, prompts: list[str], actions: np.ndarray | None = None) -> tuple[list[float], dict[str, list[float]]]:
        """One /score request of `images` or `clips` (with an action reward's `actions`), its answer checked against the pins."""
        payload = {"reward": self.reward, "prompts": prompts, field: items}
        if actions is not None:
            payload["actions"] = actions.tolist()
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
        return answer["scores"], answer.get("dimensions") or {}

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
        # requests is imported here, where a request is made: `cosmos-rl validate` and `plan` import this
        # module (through rewards.multi) but never call a service, and requests is ~0.15 CPU s to import.
        import requests

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
                f"the reward service at {self.url} refused the bearer token (HTTP {code}); {self.token_fix}"
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
    if "dimensions" in answer:
        dims = answer["dimensions"]
        why = dimensions.problem(dims, sorted(dims) if isinstance(dims, dict) else [], expected)
        if why:
            raise _Transient(f"/score answered {why}")
        answer["dimensions"] = {name: [float(v) for v in values] for name, values in dims.items()}
