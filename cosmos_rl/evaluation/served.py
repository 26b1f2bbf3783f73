"""Rewards an evaluation (`cosmos-rl eval`, `pairs mine`) scores through reward services, as a run
trains on them: a model reward from a local folder, a reward of a running service, several at once
with weights.

The options become the training side's `rewards.multi.RewardTerm`s (`served_terms`), and
`ServedRewards` scores with what a run uses: `rewards.multi.start_services` starts a loopback
service for each reward with no url (loading a model folder there), and one
`rewards.multi.MultiRewardClient` scores with every reward at once; the evaluation's score of an
image is the weighted sum of its rewards' scores. A single built-in reward with no folder, url or
weight (`--reward shapes_strict`) is scored in-process as before (`served_terms` gives None).

    --reward pickscore=FOLDER                  a model reward (rewards.models.SERVED_KINDS) from a folder
    --reward-url URL --reward pickscore        the reward `pickscore` of the service at URL
    --reward-token-env VAR                     with --reward-url: the bearer token is $VAR
    --reward-weight NAME=W                     NAME's weight in the sum (default 1)

A service at a url has its revision read from /info once and pinned for the evaluation (a service
that changes under it is refused); the revisions are recorded in the result. A model reward's
scale is its model's: its scores must be finite numbers within SERVED_RANGE (`scores.score_range`).

A run's `[[rl.eval.rewards]]` tables (the `[[rl.rewards]]` table class) become terms the same way
(`manifest_terms`, `ServedRewards(..., manifest=True)`: messages name the table's keys, each
table's token_env and revision pin apply): training's evaluation (`Evaluator.for_run`) and
`cosmos-rl eval RUN_DIR` given no --reward score with them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.evaluation.scores import SERVED_RANGE
from cosmos_rl.rewards.client import RewardClient, RewardServiceError
from cosmos_rl.rewards.multi import MultiRewardClient, RewardTerm, client_for, start_services, token_for, weighted_terms

TOKEN_FIX = "pass --reward-token-env VAR naming an environment variable that holds the service's token"
LOCAL_REVISION = "eval-local"  # what a service this evaluation starts for itself declares
TIMEOUT_S = 120.0  # one scoring request (a model reward on CPU scores a batch in seconds)
MAX_RETRIES = 2  # then a failed request is the user's service's problem, said in one line
BACKOFF_S = 0.5


def _model_kinds() -> tuple[str, ...]:
    from cosmos_rl.rewards.models import SERVED_KINDS

    return SERVED_KINDS


def _builtin_names() -> list[str]:
    from cosmos_rl.rewards.registry import builtin_rewards

    return sorted(builtin_rewards())


def served_terms(
    rewards: Sequence[str], url: str | None = None, weights: Sequence[str] = (), token_env: str | None = None,
    frame_reduce: str | None = None,
) -> list[RewardTerm] | None:  # fmt: skip
    """The `--reward` items (NAME or NAME=FOLDER), `--reward-url`, `--reward-weight NAME=W` items and
    `--reward-token-env` as reward terms, or None for one built-in reward scored in-process. Every
    mistake is a UserError naming the option, before anything loads."""
    rewards = list(rewards)
    if url is None and not weights and token_env is None and len(rewards) <= 1 and not any("=" in r for r in rewards):
        if rewards and rewards[0] in _model_kinds():
            raise UserError(f"--reward {rewards[0]}: a model reward needs its weights; pass --reward {rewards[0]}=FOLDER (a local folder), "
                            f"or --reward-url URL of a service that serves {rewards[0]}")  # fmt: skip
        return None
    if token_env is not None and url is None:
        raise UserError(f"--reward-token-env {token_env}: a token is for a service at --reward-url; pass --reward-url URL, or drop --reward-token-env")
    if url is not None and not url.startswith(("http://", "https://")):
        raise UserError(f"--reward-url {url!r}: not an http:// or https:// URL; pass the address `cosmos-rl reward serve` prints")
    if not rewards:
        raise UserError("--reward: not given; name the reward(s) to score with, e.g. --reward pickscore=FOLDER or --reward-url URL --reward pickscore")
    kinds = _model_kinds()
    named: dict[str, str] = {}  # name -> folder ("" for none)
    for item in rewards:
        name, sep, folder = item.partition("=")
        if not name or (sep and not folder):
            raise UserError(f"--reward {item!r}: expected NAME or NAME=FOLDER, e.g. --reward pickscore=/models/PickScore_v1")
        if name in named:
            raise UserError(f"--reward {name}: given twice; give each reward once (its weight with --reward-weight {name}=W)")
        if sep:
            if name not in kinds:
                raise UserError(f"--reward {item}: unknown model reward {name!r}; a folder is for one of {', '.join(kinds)}")
            path = Path(folder).expanduser()
            if not path.is_dir():
                what = "is a file, not a folder" if path.exists() else "folder not found"
                raise UserError(f"--reward {item}: {what}; pass a local folder with a transformers CLIP checkpoint (save_pretrained)")
        elif url is None:
            builtin = _builtin_names()
            if name in kinds:
                raise UserError(f"--reward {name}: a model reward needs its weights; pass --reward {name}=FOLDER (a local folder), "
                                f"or --reward-url URL of a service that serves {name}")  # fmt: skip
            if name not in builtin:
                raise UserError(f"--reward {name}: unknown reward; use a built-in one ({', '.join(builtin)}), a model reward "
                                f"({', '.join(k + '=FOLDER' for k in kinds)}), or --reward-url URL for a service's")  # fmt: skip
        named[name] = folder if sep else ""
    weight_of = dict.fromkeys(named, 1.0)
    for item in weights:
        name, sep, text = item.partition("=")
        if not sep or name not in named:
            raise UserError(f"--reward-weight {item!r}: expected NAME=W with NAME one of the --reward names ({', '.join(named)})")
        try:
            weight = float(text)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise UserError(f"--reward-weight {item}: the weight must be a finite number > 0 (got {text!r}), e.g. {name}=0.5")
        weight_of[name] = weight
    reduce = frame_reduce or "mean"
    return [
        RewardTerm(f"--reward {name}" + (f"={folder}" if folder else ""), name, weight_of[name], "" if folder or url is None else url,
                   LOCAL_REVISION if folder or url is None else "", "", str(Path(folder).expanduser().resolve()) if folder else "",
                   TIMEOUT_S, MAX_RETRIES, BACKOFF_S, token_env or "", reduce)
        for name, folder in named.items()
    ]  # fmt: skip


def read_token(token_env: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The bearer token in $token_env (`--reward-token-env`), read once, as a run reads rl.reward.token_env."""
    if token_env is None:
        return None
    token = environ.get(token_env)
    if not token:
        raise UserError(f"--reward-token-env {token_env}: the variable is not set; export {token_env}=TOKEN, or drop --reward-token-env")
    return token


def label(terms: Sequence[RewardTerm]) -> str:
    """The reward's name in results: the one reward's name, else `W*NAME+W*NAME` (the weighted sum)."""
    if len(terms) == 1 and terms[0].weight == 1.0:
        return terms[0].name
    return "+".join(f"{t.weight:g}*{t.name}" for t in terms)


def manifest_terms(config) -> list[RewardTerm] | None:
    """A run's `[[rl.eval.rewards]]` as reward terms, None when it has none (rl.eval.reward in-process)."""
    tables = config.rl.eval.rewards
    return weighted_terms(tables, "rl.eval.rewards") if tables else None


def eval_reward_name(config) -> str:
    """The name a run's evaluation scores under (its `eval/score`'s reward): the label of its
    `[[rl.eval.rewards]]`, else rl.eval.reward (`scores.score_range` bounds it)."""
    terms = manifest_terms(config)
    return label(terms) if terms else config.rl.eval.reward


class ServedRewards:
    """The services of an evaluation's reward terms, started and checked; `score` gives one number per
    image (or clip): the weighted sum of every reward's. `close` stops what was started."""

    def __init__(self, terms: list[RewardTerm], media: MediaSpec, environ: Mapping[str, str] = os.environ, manifest: bool = False):
        # `manifest`: the terms are `[[rl.eval.rewards]]` tables (messages name their keys, tokens come
        # from each table's token_env); else the command's options (`served_terms`).
        self.manifest = manifest
        self._dimensions: dict[str, list] = {}  # each reward dimension's [sum, count] since take_dimensions
        if manifest:
            tokens = {t.name: token_for(t, environ) for t in terms}
        else:
            token = read_token(terms[0].token_env or None, environ) if any(t.url for t in terms) else None
            tokens = {t.name: token if t.url else None for t in terms}
        self._services = start_services(terms, tokens, model_option="--model" if manifest else "--reward")
        try:
            pinned, self.revisions = [], {}
            for term in terms:
                url = self._services.urls[term.name]
                info = self._info(term, url, tokens[term.name])
                # A command's url is pinned to what it declares now; a manifest's table pins its own revision.
                pinned.append(attrs.evolve(term, revision=info["revision"]) if term.url and not term.revision else term)
                # The reward's own revision (a model reward's: a hash of its weights), else the service's.
                self.revisions[term.name] = (info.get("revisions") or {}).get(term.name) or info["revision"]
            self.terms = pinned
            clients = [client_for(t, self._services.urls[t.name], tokens[t.name]) for t in pinned]
            for client in clients if not manifest else ():
                client.token_fix = TOKEN_FIX
            self.client = MultiRewardClient(pinned, clients)
            self.client.check_revisions(media)
        except BaseException:
            self._services.stop()
            raise
        self.name = label(pinned)

    def _info(self, term: RewardTerm, url: str, token: str | None) -> dict:
        """The service's /info, with the reward and a revision in it; a UserError naming the option otherwise."""
        probe = RewardClient(url, term.name, "", term.timeout_s, 0, 0.0, token, key=term.key)
        option = f"{term.key}.url" if self.manifest else "--reward-url"
        if not self.manifest:
            probe.token_fix = TOKEN_FIX
        try:
            info = probe.info()
        except RewardServiceError as exc:
            raise UserError(f"{option} {url}: the reward service cannot be reached ({exc}); start it "
                            f"(`cosmos-rl reward serve`), or fix {option}") from None  # fmt: skip
        finally:
            probe.close()
        if term.name not in info["rewards"]:
            name = f"{term.key}.name" if self.manifest else term.key
            raise UserError(f"{name}: the service at {url} offers no {term.name!r}; pick one of {', '.join(map(str, info['rewards']))}")
        if not info.get("revision"):
            raise UserError(f"{option} {url}: the service declares no revision, so its scores cannot be pinned; start it "
                            "with a revision (`cosmos-rl reward serve --revision NAME`)")  # fmt: skip
        return info

    def describe(self) -> list[dict]:
        """Each reward as the result records it: name, weight, where it was scored and its revision."""
        return [{"name": t.name, "weight": t.weight, "folder": t.model or None, "url": t.url or None,
                 "revision": self.revisions.get(t.name)} for t in self.terms]  # fmt: skip

    def score(self, samples: np.ndarray, captions: Sequence[str]) -> list[float]:
        """The weighted sum of every reward's score of each uint8 image [N, H, W, 3] or clip [N, F, H, W, 3]."""
        keys = " ".join(t.key for t in self.terms)
        try:
            each, dims = self.client.score_dimensions(samples, list(captions))
        except RewardServiceError as exc:
            raise UserError(f"{keys}: the reward service gave no scores ({exc}); fix the service (its /score must answer "
                            "one finite number per sample), or score with another reward") from None  # fmt: skip
        lo, hi = SERVED_RANGE
        for term in self.terms:
            for value in each[term.name]:
                if not lo <= value <= hi:
                    raise UserError(f"{term.key}: scored a sample {value:g}, outside [{lo:g}, {hi:g}], the range an evaluation "
                                    "keeps; a reward's output must be a score of that scale: fix the reward")  # fmt: skip
        for name, values in dims.items():  # a reward's named dimensions (`videoalign.vq`): reported, never summed
            # a sum and a count, not the values: training's evaluations never take them, and must not grow
            total = self._dimensions.setdefault(name, [0.0, 0])
            total[0], total[1] = total[0] + float(sum(values)), total[1] + len(values)
        summed = [float(sum(t.weight * each[t.name][i] for t in self.terms)) for i in range(len(captions))]
        if any(not lo <= value <= hi for value in summed):
            raise UserError(f"--reward-weight: the weighted sum of {keys} leaves [{lo:g}, {hi:g}], the range an evaluation keeps; "
                            "use smaller weights")  # fmt: skip
        return summed

    def take_dimensions(self) -> dict[str, float] | None:
        """The mean of each reward dimension (`rewards.dimensions.metric_name`) over the samples scored
        since the last call, then forgotten; None when no reward returned dimensions."""
        taken, self._dimensions = self._dimensions, {}
        return {name: total / count for name, (total, count) in sorted(taken.items()) if count} or None

    def close(self) -> None:
        self.client.close()
        self._services.stop()

    def __enter__(self) -> ServedRewards:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
