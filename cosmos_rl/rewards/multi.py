"""Several rewards in one run: their built-in services, their revision checks, and one client for all.

A run names its rewards either with `[rl.reward]` (one) or `[[rl.rewards]]` (several); `reward_terms`
turns either into the same list. The driver, before Ray starts:

    services = start_reward_services(config.rl)   # tokens read once; built-in services for no-url rewards
    try:
        services.check_revisions(media)            # every pin, and the run's media; UserError naming the table's key
        ... each worker gets services.urls and services.tokens ...
    finally:
        services.stop()

and each worker scores with `MultiRewardClient.from_config(config.rl, urls, tokens)`, getting one
score list per reward name (a reward with `judge.model` set is a VLM judge at its url, scored by
`rewards.vlm_judge.VLMJudgeClient` through the same calls) (the requests to the services go out in parallel). `check_revisions`
takes the run's media (`core.media.MediaSpec`); a video run scores clips, each image reward frame by frame
(`RewardClient.score`); the built-in shapes image verifier scores a clip's frames against the
static part of its moving-shapes caption (`frame_prompt_rule`), the only caption it can parse.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import attrs
import numpy as np

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.rewards.client import RewardClient, RewardServiceError
from cosmos_rl.rewards.dimensions import metric_name
from cosmos_rl.rewards.frames import PerFramePrompts, builtin_frame_prompts, reads_frame_captions
from cosmos_rl.suites import registry as suites


@attrs.frozen
class RewardTerm:
    """One reward of a run, whichever table it came from; `key` names that table in messages."""

    key: str
    name: str
    weight: float
    url: str
    revision: str
    reward_revision: str
    model: str
    timeout_s: float
    max_retries: int
    backoff_s: float
    token_env: str
    frame_reduce: str = "mean"  # how an image reward scores a clip (cosmos_rl.rewards.frames)
    frame_stride: int = 1
    judge: object = None  # a VLM judge's JudgeConfig (rewards/vlm_judge.py) when judge.model is set, else None
    dimensions: tuple[tuple[str, float], ...] = ()  # (dimension, weight) pairs whose weighted sum is the score; () = its own


def weighted_terms(tables, prefix: str) -> list[RewardTerm]:
    """One term per weighted reward table (`[[rl.rewards]]`, `[[rl.eval.rewards]]`), keyed `prefix[i]`."""
    return [
        RewardTerm(f"{prefix}[{i}]", t.name, t.weight, t.url, t.revision, t.reward_revision, t.model,
                   t.timeout_s, t.max_retries, t.backoff_s, t.token_env, t.frame_reduce, t.frame_stride, _judge(t),
                   tuple(sorted(t.dimensions.items())))
        for i, t in enumerate(tables)
    ]  # fmt: skip


def reward_terms(rl) -> list[RewardTerm]:
    """The run's rewards: each `[[rl.rewards]]` table, else the one `[rl.reward]` (weight 1)."""
    if rl.rewards:
        return weighted_terms(rl.rewards, "rl.rewards")
    r = rl.reward
    return [RewardTerm("rl.reward", r.name, 1.0, r.url, r.revision, "", "", r.timeout_s, r.max_retries, r.backoff_s, r.token_env,
                       r.frame_reduce, r.frame_stride, _judge(r))]


def _judge(table):
    return table.judge if table.judge.model else None


def token_for(term: RewardTerm, environ: Mapping[str, str] = os.environ) -> str | None:
    if not term.token_env:
        return None
    token = environ.get(term.token_env)
    if not token:
        raise UserError(f"{term.key}.token_env names {term.token_env!r}, which is not set; export it or clear {term.key}.token_env")
    return token


def frame_prompt_rule(term: RewardTerm) -> Callable[[str], str | None] | None:
    """What `term` scores a clip's frames against when the caller names nothing: for the built-in
    shapes image verifier (no url), each moving-shapes caption's static part ("a red circle moving
    left" -> "a red circle"; None for a colour change, which the client then refuses by name), since
    its parser reads image captions only; None (the clip's own prompt) for every other reward."""
    if term.url or not reads_frame_captions(term.name):
        return None
    return lambda caption: builtin_frame_prompts(term.name, [caption])[0]


def client_for(term: RewardTerm, url: str, token: str | None):
    """The term's client: a `RewardClient` of its service, or a `VLMJudgeClient` for a VLM judge."""
    if term.judge is not None:
        from cosmos_rl.rewards.vlm_judge import VLMJudgeClient

        return VLMJudgeClient(url, term.name, term.judge, term.timeout_s, term.max_retries, term.backoff_s, token, key=term.key)
    return RewardClient(
        url, term.name, term.revision, term.timeout_s, term.max_retries, term.backoff_s, token,
        key=term.key, expected_reward_revision=term.reward_revision, frame_reduce=term.frame_reduce,
        frame_stride=term.frame_stride, dimension_weights=dict(term.dimensions),
    )  # fmt: skip


class RewardServices:
    """The run's reward URLs and tokens by reward name, and the built-in services started for them."""

    def __init__(self, terms: list[RewardTerm], urls: dict[str, str], tokens: dict[str, str | None], servers: list):
        self.terms, self.urls, self.tokens, self._servers = terms, urls, tokens, servers

    def check_revisions(self, media: MediaSpec) -> dict[str, dict]:
        """Every service's /info against its pins and against what the run makes (`media`, the run's;
        see RewardClient.check_revision); /info answers by reward name.

        A mismatch, or a service that cannot be reached at all, is a UserError naming the table's
        key: nothing has started yet, so it is a setup problem to fix, not a failed run.
        """
        answers = {}
        for t in self.terms:
            client = client_for(t, self.urls[t.name], self.tokens[t.name])
            try:
                answers[t.name] = client.check_revision(media)
            except RewardServiceError as exc:
                what = "VLM judge" if t.judge is not None else "reward service"
                raise UserError(
                    f"{t.key}.url: the {what} at {self.urls[t.name]} cannot be reached before training ({exc}); "
                    + ("start it (docs/judge.md), or fix the url (its API root, e.g. http://127.0.0.1:8000/v1)"
                       if t.judge is not None else f"start it, or fix {t.key}.url (empty starts the built-in service)")
                ) from None
            finally:
                client.close()
        return answers

    def stop(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers = []


def start_reward_services(rl, environ: Mapping[str, str] = os.environ) -> RewardServices:
    """Read every token, then start a built-in loopback service for every reward with no url.

    One service per such reward (loading its model folder), declaring that reward's pinned
    revision; the rest keep their url. Tokens are read here, once, so workers get the values.
    """
    terms = reward_terms(rl)
    return start_services(terms, {t.name: token_for(t, environ) for t in terms})


def start_services(terms: list[RewardTerm], tokens: dict[str, str | None], model_option: str = "--model") -> RewardServices:
    """The services of `terms` (tokens already read): a built-in loopback service for every term
    with no url, loading its model folder (`term.model`; a bad folder is a UserError naming
    `model_option`), declaring the term's revision; the rest keep their url. A run's
    (`start_reward_services`) and an evaluation's (`evaluation.served`) rewards start here."""
    from cosmos_rl.rewards.server import RewardServer

    urls, servers = {}, []
    try:
        for term in terms:
            if term.url:
                urls[term.name] = term.url
                continue
            # A reward of a suite outside the package is served by importing that suite.
            owner = suites.reward_owner(term.name)
            outside = (owner.name,) if owner is not None and owner.name not in suites.BUILT_IN else ()
            server = RewardServer("127.0.0.1", 0, revision=term.revision or None, models={term.name: term.model} if term.model else None,
                                  outside_suites=outside, model_option=model_option)  # fmt: skip
            urls[term.name] = server.start()
            servers.append(server)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return RewardServices(terms, urls, tokens, servers)


class MultiRewardClient:
    """Scores the same images with every reward of a run, one client (and service) per reward."""

    def __init__(self, terms: list[RewardTerm], clients: list[RewardClient]):
        self.terms, self.clients = terms, clients
        self._frame_rules = {t.name: frame_prompt_rule(t) for t in terms}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(clients)), thread_name_prefix="reward-client")

    @classmethod
    def from_config(cls, rl, urls: Mapping[str, str], tokens: Mapping[str, str | None]) -> MultiRewardClient:
        """One client per reward of the run, at `urls[name]` with `tokens[name]` (from RewardServices)."""
        terms = reward_terms(rl)
        return cls(terms, [client_for(t, urls[t.name], tokens.get(t.name)) for t in terms])

    @property
    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.terms}

    def check_revisions(self, media: MediaSpec) -> dict[str, dict]:
        return {c.reward: c.check_revision(media) for c in self.clients}

    def score(
        self, images_or_clips: np.ndarray, prompts: Sequence[str], per_frame_prompts: PerFramePrompts = None
    ) -> dict[str, list[float]]:
        """{reward name: scores, one per image or clip}; the first failure (RewardServiceError/UserError) is
        raised. `per_frame_prompts`: what each image reward scores a clip's frames against
        (RewardClient.score); None takes each reward's own rule for clips (`frame_prompt_rule`)."""
        clips = isinstance(images_or_clips, np.ndarray) and images_or_clips.ndim == 5

        def per_frame(client: RewardClient) -> PerFramePrompts:
            return per_frame_prompts if per_frame_prompts is not None or not clips else self._frame_rules.get(client.reward)

        futures = {c.reward: self._pool.submit(c.score, images_or_clips, prompts, per_frame(c)) for c in self.clients}
        return {name: future.result() for name, future in futures.items()}

    def dimension_names(self) -> list[str]:
        """Every reward's named dimensions as table names (`dimensions.metric_name`: `videoalign.vq`), in
        name order; a client with no /info dimensions (a VLM judge) has none."""
        names = []
        for client in self.clients:
            listed = client.dimensions() if hasattr(client, "dimensions") else ()
            names += [metric_name(client.reward, d) for d in listed]
        return sorted(names)

    def score_dimensions(
        self, images_or_clips: np.ndarray, prompts: Sequence[str], per_frame_prompts: PerFramePrompts = None,
        actions: np.ndarray | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """`score`'s {reward name: scores}, and {`reward.dimension`: values} of the rewards with dimensions.
        `actions` [N, rows, width]: each clip's action rows, which the rewards that take them are sent."""
        clips = isinstance(images_or_clips, np.ndarray) and images_or_clips.ndim == 5

        def call(client):
            rule = per_frame_prompts if per_frame_prompts is not None or not clips else self._frame_rules.get(client.reward)
            if actions is not None and isinstance(client, RewardClient):
                return client.score_dimensions(images_or_clips, prompts, rule, actions)
            if hasattr(client, "score_dimensions"):
                return client.score_dimensions(images_or_clips, prompts, rule)
            return client.score(images_or_clips, prompts, rule), {}

        futures = {c.reward: self._pool.submit(call, c) for c in self.clients}
        scores, dims = {}, {}
        for name, future in futures.items():
            scores[name], own = future.result()
            dims.update({metric_name(name, d): values for d, values in own.items()})
        return scores, dims

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self._pool.shutdown(wait=False)
