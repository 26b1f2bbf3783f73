"""Preflight rules of the reward tables: `[rl.reward]` (one) and `[[rl.rewards]]` (several), for
every online algorithm (`online.py` calls `reward_rules`); and the built-in reward names that
`[rl.eval]`, the image-to-video rules, `plan` and the scorers check against. Torch-free.
"""

from __future__ import annotations

import math
import re

from cosmos_rl.core import schema
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core.problems import show
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import Suite

WEIGHT_FREE_REWARDS = ("jpeg_compressibility", "jpeg_incompressibility", "brightness", "prompt_colour")  # cosmos_rl.rewards.functions.REWARDS, torch-free
MODEL_REWARDS = ("pickscore", "clipscore", "aesthetic", "hps", "videoalign")  # cosmos_rl.rewards.models.SERVED_KINDS, torch-free


# What the built-in service offers besides model rewards: the weight-free rewards and every reward a
# suite registers (`cosmos_rl.suites.registry`: those of a suite of clips score whole clips).
def builtin_rewards() -> list[str]:
    """The weight-free rewards, then the built-in suites' rewards (an outside suite's are `package.module:SUITE/REWARD`)."""
    return [*WEIGHT_FREE_REWARDS, *suites.builtin_reward_names()]


def owner(name: str) -> Suite | None:
    """The suite registering reward `name`; None for any other name, and for an outside suite's that
    cannot be imported (the name's own rule says why: `unknown_reward`)."""
    try:
        return suites.reward_owner(name)
    except suites.UnknownSuite:
        return None


def unknown_reward(name: str) -> tuple[str, str] | None:
    """(problem, fix) when the built-in service cannot score `name`, else None."""
    try:
        if name in WEIGHT_FREE_REWARDS or suites.reward_owner(name) is not None:
            return None
    except suites.UnknownSuite as exc:
        return exc.problem, exc.fix
    return "not a built-in reward", f"use one of {', '.join(show(n) for n in builtin_rewards())}"


def scores_clips(name: str) -> bool:
    """A suite's reward of whole clips (its suite judges clips)."""
    suite = owner(name)
    return suite is not None and suite.judges_clips


def judges_given_frame(name: str) -> bool:
    """A suite's reward that judges frame 0 against the suite's given first frame (image-to-video)."""
    suite = owner(name)
    return suite is not None and suite.reward(name).given_frame


def image_twin(name: str) -> str | None:
    """The image reward with the same score as the clip reward `name`: the same part (strict or
    partial) of the image suite that scores its suite's clips frame by frame (`shapes_video_strict`
    -> `shapes_strict`); None when there is none."""
    suite = owner(name)
    if suite is None or not suite.frame_suite:
        return None
    part = suite.reward(name).part
    return next((r.name for r in suites.get(suite.frame_suite).rewards if r.part == part and not r.given_frame), None)


# A reward call (one group's images) that takes longer than this is stuck, not slow; and a finite
# bound keeps every wait of the client a deadline (an infinite one would hang the step for good).
REWARD_TIMEOUT_MAX_S = 3600.0
REWARD_BACKOFF_MAX_S = 600.0  # the first retry's wait; it doubles per retry


def reward_rules(c: schema.RunConfig, rl: schema.OnlineRLBase, r: Rules) -> None:
    """The run's rewards: several ([[rl.rewards]]) when given, else the one [rl.reward]."""
    if rl.rewards:
        _reward_terms(c, rl, r)
    else:
        _one_reward(c, rl, r)


def _client_limits(prefix: str, t, r: Rules) -> None:
    """How the client talks to one reward service: deadline, retries, backoff, token variable."""
    r.positive(f"{prefix}.timeout_s", t.timeout_s)
    if t.timeout_s > 0 and not t.timeout_s <= REWARD_TIMEOUT_MAX_S:
        r.error(f"{prefix}.timeout_s", f"must be finite and at most {REWARD_TIMEOUT_MAX_S:g} s", t.timeout_s,
                "a reward call that takes longer is stuck; use e.g. 60, or 600 for slow model rewards")
    r.at_least(f"{prefix}.max_retries", t.max_retries, 0)
    r.at_least(f"{prefix}.backoff_s", t.backoff_s, 0)
    if t.backoff_s >= 0 and not t.backoff_s <= REWARD_BACKOFF_MAX_S:
        r.error(f"{prefix}.backoff_s", f"must be finite and at most {REWARD_BACKOFF_MAX_S:g} s (it doubles per retry)", t.backoff_s,
                "use e.g. 0.5")
    if t.token_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t.token_env):
        r.error(f"{prefix}.token_env", "must be an environment variable name", t.token_env, "e.g. REWARD_TOKEN")


def _frame_keys(c: schema.RunConfig, prefix: str, t, r: Rules) -> None:
    """frame_reduce / frame_stride: how an image reward scores a clip frame by frame, so only on a
    video run and never on a reward that scores whole clips itself."""
    r.at_least(f"{prefix}.frame_stride", t.frame_stride, 1)
    if t.frame_stride > 1 and t.frame_reduce in ("first", "last"):
        r.error(f"{prefix}.frame_stride", f"plays no part with frame_reduce = \"{t.frame_reduce}\", which scores one frame", t.frame_stride,
                f'remove {prefix}.frame_stride, or use frame_reduce = "mean" or "min"')
    default = schema.RewardClientConfig()
    changed = [k for k in ("frame_reduce", "frame_stride") if getattr(t, k) != getattr(default, k)]
    builtin_video = not t.url and scores_clips(t.name)
    if t.judge.model:
        for k in changed:
            r.error(f"{prefix}.{k}", "plays no part for a VLM judge, which sees judge.frames frames of each clip at once", getattr(t, k),
                    f"remove {prefix}.{k}; set {prefix}.judge.frames")
        return
    if c.model.num_frames == 1:
        for k in changed:
            r.error(f"{prefix}.{k}", "set for an image run (model.num_frames = 1), where no clip is scored frame by frame", getattr(t, k),
                    f"remove {prefix}.{k}, or make video (model.num_frames = 4k + 1 above 1)")
        if builtin_video:
            twin = image_twin(t.name)
            r.error(f"{prefix}.name", "scores whole clips, and this run makes images (model.num_frames = 1)", t.name,
                    (f'use "{twin}" for images' if twin else "use an image reward") + ", or make video (model.num_frames = 4k + 1 above 1)")
    elif builtin_video:
        for k in changed:
            r.error(f"{prefix}.{k}", f"plays no part: {t.name} scores whole clips itself, not frame by frame", getattr(t, k),
                    f"remove {prefix}.{k} (it is for image rewards scoring clips)")


def _judge_keys(prefix: str, t, r: Rules) -> None:
    """A VLM judge (`judge.model` set): reached at its url, read by its regex, within its range."""
    j = t.judge
    if not j.model:
        if j != schema.JudgeConfig():
            r.error(f"{prefix}.judge.model", "required: the judge's other keys are set but no model names it", "",
                    "set judge.model to the model the server serves, or remove the judge table")
        return
    if not t.url:
        r.error(f"{prefix}.url", "required for a VLM judge: the OpenAI-compatible server's API root", "",
                "e.g. http://127.0.0.1:8000/v1 (vllm serve) or http://127.0.0.1:30000/v1 (sglang)")
    if getattr(t, "model", ""):
        r.error(f"{prefix}.model", "a folder for the built-in service's model rewards; a VLM judge is served by its own server", t.model, "remove model")
    try:
        groups = re.compile(j.score_regex).groups
    except re.error as exc:
        r.error(f"{prefix}.judge.score_regex", f"not a regular expression ({exc})", j.score_regex, "fix it, e.g. 'Score:\\s*([0-9.]+)'")
    else:
        if groups < 1:
            r.error(f"{prefix}.judge.score_regex", "has no capture group: group 1 is the score", j.score_regex, "put the number in one, e.g. 'Score:\\s*([0-9.]+)'")
    lo_hi = j.score_range
    if len(lo_hi) != 2 or not all(math.isfinite(v) for v in lo_hi) or not lo_hi[0] < lo_hi[1]:
        r.error(f"{prefix}.judge.score_range", "must be [lo, hi], two finite numbers with lo < hi", lo_hi, "e.g. [0, 10]")
    r.at_least(f"{prefix}.judge.frames", j.frames, 1)
    r.at_least(f"{prefix}.judge.max_tokens", j.max_tokens, 1)
    r.at_least(f"{prefix}.judge.concurrency", j.concurrency, 1)
    if "{prompt}" not in j.prompt:
        r.warn(f"{prefix}.judge.prompt", "has no {prompt}: the judge never sees the caption", j.prompt[:60], "add {prompt} where the caption goes")


def _one_reward(c: schema.RunConfig, rl: schema.NFTConfig, r: Rules) -> None:
    if not rl.reward.revision:
        r.error("rl.reward.revision", "required: the provider's revision is part of the run identity", "", "set rl.reward.revision to the revision the service declares")
    if rl.reward.url and not re.match(r"https?://", rl.reward.url):
        r.error("rl.reward.url", "must be an http:// or https:// URL", rl.reward.url, "e.g. http://127.0.0.1:8000, or empty for the built-in service")
    unknown = unknown_reward(rl.reward.name) if not rl.reward.url and not rl.reward.judge.model else None
    if unknown:
        r.error("rl.reward.name", unknown[0], rl.reward.name, unknown[1])
    _judge_keys("rl.reward", rl.reward, r)
    _client_limits("rl.reward", rl.reward, r)
    _frame_keys(c, "rl.reward", rl.reward, r)
    if rl.reward_combine != "weighted_sum":
        r.warn("rl.reward_combine", "has no effect with one reward ([rl.reward]); it combines the [[rl.rewards]] tables", rl.reward_combine, "remove it")


def _reward_terms(c: schema.RunConfig, rl: schema.NFTConfig, r: Rules) -> None:
    """[[rl.rewards]]: several rewards, each its own service (or its own built-in one)."""
    if rl.reward != schema.RewardConfig():
        r.error("rl.rewards", "give either [rl.reward] (one reward) or [[rl.rewards]] (several), not both", "both",
                "move the [rl.reward] settings into a [[rl.rewards]] table and remove [rl.reward]")
    weighted_tables(c, rl.rewards, "rl.rewards", r)


def weighted_tables(c: schema.RunConfig, tables, prefix: str, r: Rules, driver_service: bool = True) -> None:
    """Each weighted reward table (`[[rl.rewards]]`, `[[rl.eval.rewards]]`, keyed `prefix[i]`): its
    own service, or its own built-in one. `driver_service`: a built-in service listens on the
    driver's node only (training's); an evaluation's is started by every process that scores."""
    seen: set[str] = set()
    for i, t in enumerate(tables):
        if not t.name:
            r.error(f"{prefix}[{i}].name", "required: the reward the service computes", "", 'set e.g. name = "brightness"')
        elif t.name in seen:
            r.error(f"{prefix}[{i}].name", "names a reward listed before; list each reward once", t.name, "remove the repeated table")
        seen.add(t.name)
        if not (math.isfinite(t.weight) and t.weight > 0):
            r.error(f"{prefix}[{i}].weight", "must be a finite number > 0", t.weight, "set e.g. weight = 1.0")
        if not t.revision:
            why = "the provider's revision is part of the run identity" if driver_service else "every evaluation pins the revision its service declares"
            r.error(f"{prefix}[{i}].revision", f"required: {why}", "", "set it to the revision the service declares")
        if t.url and not re.match(r"https?://", t.url):
            r.error(f"{prefix}[{i}].url", "must be an http:// or https:// URL", t.url, "e.g. http://127.0.0.1:8000, or empty for the built-in service")
        if t.url and t.model:
            r.error(f"{prefix}[{i}].model", "only for the built-in service (empty url); a service at a URL loads its own models", t.model, "remove model, or clear url")
        if not t.url and not t.judge.model:
            _builtin_term(c, t, f"{prefix}[{i}]", r, driver_service)
        _judge_keys(f"{prefix}[{i}]", t, r)
        _dimension_keys(f"{prefix}[{i}]", t, r)
        _client_limits(f"{prefix}[{i}]", t, r)
        _frame_keys(c, f"{prefix}[{i}]", t, r)


def _dimension_keys(key: str, t: schema.WeightedRewardConfig, r: Rules) -> None:
    """`dimensions`: weights > 0 of named dimensions, which a VLM judge does not return."""
    if t.dimensions and t.judge.model:
        r.error(f"{key}.dimensions", "a VLM judge returns one score, no named dimensions", show(sorted(t.dimensions)), "clear dimensions")
    for name, w in t.dimensions.items():
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0):
            r.error(f"{key}.dimensions.{name}", "must be a finite number > 0", w, f"set e.g. {name} = 1.0, or leave the dimension out")


def _builtin_term(c: schema.RunConfig, t: schema.WeightedRewardConfig, key: str, r: Rules, driver_service: bool) -> None:
    if t.model:
        if t.name not in MODEL_REWARDS:
            r.error(f"{key}.name", "not a model reward the built-in service can load", t.name, f"use one of {', '.join(show(n) for n in MODEL_REWARDS)}")
        r.local_path(f"{key}.model", t.model, kind="folder")
        if not t.reward_revision:
            r.warn(f"{key}.reward_revision", "not pinned: a changed model in the folder would pass as the same reward", "",
                   "set it to the revision `cosmos-rl reward serve --revision REV --model NAME=FOLDER` prints for the folder")
    elif t.name in MODEL_REWARDS:
        r.error(f"{key}.model", "required: the built-in service loads a model reward from a local folder", "", "set model to the folder, or url to a service that serves it")
    elif t.name and unknown_reward(t.name):
        problem, fix = unknown_reward(t.name)
        r.error(f"{key}.name", problem, t.name, fix + (", a model reward with model, or a url" if problem == "not a built-in reward" else ""))
    if driver_service and c.grid.nodes > 1:
        r.error(f"{key}.url", "the built-in reward service listens on 127.0.0.1 of the driver's node, which other nodes cannot reach", "",
                "run `cosmos-rl reward serve --host 0.0.0.0 --token-env REWARD_TOKEN` where every node can reach it and set the url")
