"""Scoring an evaluation's images, and the totals that add up across ranks. Torch-free.

An evaluation scores with one suite (`cosmos_rl.suites`). With one of the suite's rewards (the
shapes suite's `shapes_strict` or `shapes_partial`) the suite's verifier gives both scores of every
image (or clip, for a suite of clips): the headline `score` is strict (GenEval's rule),
`score_partial` the fraction of constraints met. A built-in weight-free reward gives one score per
image (its value) and no partial.

A task's score is the mean over its images; the overall score is the unweighted mean of the task
scores (as GenEval averages). Prompts outside the suite's grammar (possible with a weight-free
reward) form one task, `other`. Worked example with the shapes suite, captions ["a circle", "a
square", "two circles"] scored strict [1, 0, 1] and partial [1, 0.5, 1]: tasks {single_object:
0.5, counting: 1.0}, score 0.75; partial tasks {single_object: 0.75, counting: 1.0}, score_partial
0.875.

Ranks hold `Totals` (per task: images, score sum, partial sum); totals add, so the ranks' shares
give the numbers one process scoring everything gives. Beside them, `PromptTotals` (the same sums
per prompt) feed the bootstrap intervals (`evaluation.intervals`): `with_intervals` attaches each
task's per-prompt scores and their intervals to an `EvalScores`, `difference` pairs a checkpoint's
with its base's. The prompt sums are reduced apart from the task sums, so adding them changes no
task score by a bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from cosmos_rl.evaluation.intervals import Intervals, bootstrap, paired
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import Suite

OTHER = "other"  # the task of a prompt outside the suite's grammar (weight-free rewards only)
_PARTS = ("n", "score", "partial")


# The interval every per-image score of a reward lies in, by name, without importing anything a
# file names: a suite's rewards are its verifier's strict (0 or 1) or partial (the fraction of its
# constraints met) score, so [0, 1]; the weight-free ones (rewards.functions.REWARDS) each their own.
# A JPEG's size in kB is bounded by JPEG_KB_MAX, 1e6 kB (1 GB): far over any image the media checks
# allow, and small enough that sums and differences of scores stay finite.
UNIT = (0.0, 1.0)
JPEG_KB_MAX = 1e6
WEIGHT_FREE_RANGES = {
    "brightness": UNIT, "prompt_colour": UNIT,
    "jpeg_compressibility": (-JPEG_KB_MAX, 0.0), "jpeg_incompressibility": (0.0, JPEG_KB_MAX),
}  # fmt: skip


# A reward scored through a service (a model reward's folder, a service's url, several weighted:
# `evaluation.served`) has its model's scale (PickScore's is about 20, an aesthetic head's 1 to 10),
# which no name bounds; an evaluation refuses a score outside SERVED_RANGE, wide enough for any
# honest model reward and small enough that sums and differences of scores stay finite.
SERVED_MAX = 1e6
SERVED_RANGE = (-SERVED_MAX, SERVED_MAX)


def score_range(reward: str) -> tuple[float, float]:
    """[lo, hi] of one image's score under `reward` (its mean over images, prompts and tasks too);
    the partial score is always in UNIT. Checked against what a file claims (eval.json, the
    evaluation cache), never imports a reward: a weight-free reward's own range, a suite's verifier
    [0, 1], any other name (a reward scored through a service) SERVED_RANGE."""
    if reward in WEIGHT_FREE_RANGES:
        return WEIGHT_FREE_RANGES[reward]
    prefix, slash, _ = reward.rpartition("/")
    if (slash and ":" in prefix) or reward in suites.builtin_reward_names():  # an outside suite's reward, or a built-in suite's
        return UNIT
    return SERVED_RANGE


def uses_verifier(reward: str) -> bool:
    """Whether `reward` is a suite's (its verifier gives both scores), not a weight-free one."""
    return suites.reward_owner(reward) is not None


def groups_of(suite: Suite) -> tuple[str, ...]:
    """The tasks an evaluation of `suite` counts images under, in report order."""
    return (*suite.tasks, OTHER)


def reward_names(suite: Suite) -> list[str]:
    """The rewards an evaluation of `suite` may use: its own, and the built-in weight-free ones when
    it judges images."""
    if suite.judges_clips:
        return suite.reward_names()
    # The weight-free rewards import PIL: only when an evaluation asks.
    from cosmos_rl.rewards.functions import REWARDS

    return sorted([*REWARDS, *suite.reward_names()])


def group_of(caption: str, reward: str, suite: Suite) -> str:
    """The task a caption's images count under; with a suite's reward a caption must parse."""
    if uses_verifier(reward):
        return suite.task_of(caption)
    try:
        return suite.task_of(caption)
    except ValueError:
        return OTHER


def caption_groups(captions: Sequence[str], reward: str, origin: str, suite: Suite) -> dict[str, str]:
    """{caption: task} for every caption, or a UserError naming `origin` and the prompt's number
    when a suite's reward meets a caption outside the suite's grammar."""
    from cosmos_rl.core.errors import UserError

    groups = {}
    for number, caption in enumerate(captions, start=1):
        try:
            groups[caption] = group_of(caption, reward, suite)
        except ValueError as exc:
            source = f" ({suite.prompt_source})" if suite.prompt_source else ""
            raise UserError(
                f"{origin}: prompt {number}: {exc}; the {suite.title} verifier ({reward}) scores {suite.title} captions only: "
                f"use a {suite.title} prompt file{source} or another reward"
            ) from None
    return groups


def score_images(reward: str, images: np.ndarray, captions: Sequence[str], suite: Suite) -> tuple[list[float], list[float] | None]:
    """(score, partial or None) per uint8 [N, H, W, 3] image, or per [N, F, H, W, 3] clip with a
    suite of clips."""
    if uses_verifier(reward):
        return suite.verify(images, captions)
    from cosmos_rl.rewards.functions import REWARDS

    return [float(v) for v in REWARDS[reward](images, list(captions))], None


@dataclass(frozen=True)
class EvalScores:
    """One evaluation's numbers (see the module docstring); `*_partial` are None without the verifier."""

    reward: str
    score: float
    score_partial: float | None
    tasks: dict[str, float]
    tasks_partial: dict[str, float] | None
    images: dict[str, int]  # images scored per task
    # Set by `with_intervals`: each task's per-prompt scores (the mean over its seeds, in prompt
    # order) and their bootstrap intervals; None until then.
    prompt_scores: dict[str, tuple[float, ...]] | None = None
    prompt_partials: dict[str, tuple[float, ...]] | None = None
    intervals: Intervals | None = None
    intervals_partial: Intervals | None = None

    @property
    def n_images(self) -> int:
        return sum(self.images.values())

    def metrics(self) -> dict[str, float]:
        """The `eval/` metrics row: eval/score, eval/score_partial, eval/task/<task>, eval/task_partial/<task>,
        and with intervals eval/score_lo, eval/score_hi (eval/score_partial_lo, _hi)."""
        out = {"eval/score": self.score, **{f"eval/task/{t}": v for t, v in self.tasks.items()}}
        if self.intervals is not None:
            out["eval/score_lo"], out["eval/score_hi"] = self.intervals.overall
        if self.score_partial is not None:
            out["eval/score_partial"] = self.score_partial
            out.update({f"eval/task_partial/{t}": v for t, v in (self.tasks_partial or {}).items()})
            if self.intervals_partial is not None:
                out["eval/score_partial_lo"], out["eval/score_partial_hi"] = self.intervals_partial.overall
        return out

    def watched(self) -> dict[str, float]:
        """`metrics()` plus each task's per-prompt scores under `PROMPT_KEY` keys, what the
        reward-hacking watch needs to judge a drop against its noise (`evaluation.hacking`);
        `evaluation.during` takes them out before the row is written."""
        out = self.metrics()
        assert self.prompt_scores is not None, "watched() needs with_intervals first"
        for task, values in self.prompt_scores.items():
            out.update({f"{PROMPT_KEY}{task}/{i}": v for i, v in enumerate(values)})
        return out


# The prefix of the per-prompt scores an evaluation during training hands the watch (never logged),
# and of the rl.eval.gold reward's.
PROMPT_KEY = "watch/prompt/"
GOLD_KEY = "watch/gold/"


def gold_metrics(gold: "PromptTotals", tasks_of: Sequence[str]) -> dict[str, float]:
    """The rl.eval.gold reward's row entries: `eval/gold` (the unweighted mean of its task means,
    as eval/score), `eval/gold_lo` and `eval/gold_hi` (its bootstrap interval over prompts), and its
    per-prompt scores under `GOLD_KEY` keys for the watch."""
    by_task = gold.by_task(tasks_of, "score")
    out = {"eval/gold": float(np.mean([np.mean(v) for v in by_task.values()]))}
    out["eval/gold_lo"], out["eval/gold_hi"] = bootstrap(by_task).overall
    for task, values in by_task.items():
        out.update({f"{GOLD_KEY}{task}/{i}": v for i, v in enumerate(values)})
    return out


def split_prompt_scores(metrics: dict[str, float], prefix: str = PROMPT_KEY) -> tuple[dict[str, float], dict[str, tuple[float, ...]]]:
    """(the metrics without the `prefix` entries, {task: per-prompt scores in prompt order})."""
    rest, found = {}, {}
    for key, value in metrics.items():
        if key.startswith(prefix):
            task, index = key[len(prefix):].rsplit("/", 1)
            found.setdefault(task, {})[int(index)] = value
        else:
            rest[key] = value
    return rest, {task: tuple(v[i] for i in sorted(v)) for task, v in found.items()}


@dataclass
class Totals:
    """Per task (`groups_of(suite)`, in order): [images, score sum, partial sum]."""

    sums: dict[str, list[float]]

    @classmethod
    def empty(cls, groups: Sequence[str]) -> "Totals":
        return cls({g: [0.0, 0.0, 0.0] for g in groups})

    def add(self, group: str, score: float, partial: float | None) -> None:
        entry = self.sums[group]
        entry[0] += 1.0
        entry[1] += float(score)
        entry[2] += float(partial) if partial is not None else 0.0

    def as_dict(self) -> dict[str, float]:
        """Flat `{task/n, task/score, task/partial}` with every task present (the same keys on every rank)."""
        return {f"{g}/{part}": row[i] for g, row in self.sums.items() for i, part in enumerate(_PARTS)}

    @classmethod
    def from_dict(cls, flat: dict[str, float], groups: Sequence[str]) -> "Totals":
        return cls({g: [float(flat[f"{g}/{part}"]) for part in _PARTS] for g in groups})

    def __add__(self, other: "Totals") -> "Totals":
        assert list(self.sums) == list(other.sums), "totals of different evaluations"
        return Totals({g: [a + b for a, b in zip(row, other.sums[g])] for g, row in self.sums.items()})

    def scores(self, reward: str) -> EvalScores:
        present = [g for g, row in self.sums.items() if row[0] > 0]
        if not present:
            raise ValueError("no images were scored")
        # Counts are whole numbers carried as floats (rank means times the world size): round them.
        images = {g: int(round(self.sums[g][0])) for g in present}
        tasks = {g: self.sums[g][1] / self.sums[g][0] for g in present}
        partial = uses_verifier(reward)
        tasks_partial = {g: self.sums[g][2] / self.sums[g][0] for g in present} if partial else None
        return EvalScores(
            reward=reward,
            score=sum(tasks.values()) / len(tasks),
            score_partial=sum(tasks_partial.values()) / len(tasks_partial) if tasks_partial else None,
            tasks=tasks,
            tasks_partial=tasks_partial,
            images=images,
        )


@dataclass
class PromptTotals:
    """Per prompt of an evaluation, by its position in the prompt list: [images, score sum, partial sum].

    Every rank holds a row for every prompt (zeros for prompts it did not score), so the flat
    dicts of all ranks have the same keys and add element by element."""

    sums: list[list[float]]

    @classmethod
    def empty(cls, n_prompts: int) -> "PromptTotals":
        return cls([[0.0, 0.0, 0.0] for _ in range(n_prompts)])

    def add(self, prompt: int, score: float, partial: float | None) -> None:
        entry = self.sums[prompt]
        entry[0] += 1.0
        entry[1] += float(score)
        entry[2] += float(partial) if partial is not None else 0.0

    def as_dict(self) -> dict[str, float]:
        return {f"prompt/{i}/{part}": row[k] for i, row in enumerate(self.sums) for k, part in enumerate(_PARTS)}

    @classmethod
    def from_dict(cls, flat: dict[str, float], n_prompts: int) -> "PromptTotals":
        return cls([[float(flat[f"prompt/{i}/{part}"]) for part in _PARTS] for i in range(n_prompts)])

    def __add__(self, other: "PromptTotals") -> "PromptTotals":
        assert len(self.sums) == len(other.sums), "prompt totals of different evaluations"
        return PromptTotals([[a + b for a, b in zip(x, y)] for x, y in zip(self.sums, other.sums)])

    def by_task(self, tasks_of: Sequence[str], part: str) -> dict[str, tuple[float, ...]]:
        """{task: per-prompt means of `part` ("score" or "partial")}, prompts in list order."""
        assert len(tasks_of) == len(self.sums), f"{len(tasks_of)} tasks for {len(self.sums)} prompts"
        k = _PARTS.index(part)
        out: dict[str, list[float]] = {}
        for task, row in zip(tasks_of, self.sums):
            images = round(row[0])  # a whole number carried as a float (rank means times the world size)
            assert images > 0, "every prompt of an evaluation is scored under every seed"
            out.setdefault(task, []).append(row[k] / images)
        return {task: tuple(values) for task, values in out.items()}


def with_intervals(scores: EvalScores, prompts: PromptTotals, tasks_of: Sequence[str]) -> EvalScores:
    """`scores` with each task's per-prompt scores and their bootstrap intervals (strict, and partial
    with the verifier). `tasks_of[i]` is the task of prompt i."""
    strict = _ordered(prompts.by_task(tasks_of, "score"), scores.tasks)
    partial = _ordered(prompts.by_task(tasks_of, "partial"), scores.tasks_partial) if scores.tasks_partial is not None else None
    return replace(
        scores, prompt_scores=strict, prompt_partials=partial,
        intervals=bootstrap(strict), intervals_partial=bootstrap(partial) if partial is not None else None,
    )  # fmt: skip


def _ordered(by_task: dict[str, tuple[float, ...]], tasks: dict[str, float]) -> dict[str, tuple[float, ...]]:
    # Every prompt has the same number of images, so a task's mean over prompts is its mean over images.
    assert sorted(by_task) == sorted(tasks), f"prompt tasks {list(by_task)} against {list(tasks)}"
    for task, values in by_task.items():
        assert abs(sum(values) / len(values) - tasks[task]) < 1e-9, f"task {task}: prompt means do not average to its score"
    return {task: by_task[task] for task in tasks}


def difference(policy: EvalScores, base: EvalScores) -> EvalScores:
    """The checkpoint minus its base on the same items: the differences of the scores, and the paired
    bootstrap intervals of the per-prompt differences (both from `with_intervals`)."""
    assert policy.prompt_scores is not None and base.prompt_scores is not None, "difference needs with_intervals first"
    assert list(policy.tasks) == list(base.tasks), "the checkpoint and its base score the same tasks"

    def minus(a: dict[str, tuple[float, ...]], b: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
        return {t: tuple(x - y for x, y in zip(a[t], b[t], strict=True)) for t in a}

    partial = policy.prompt_partials is not None and base.prompt_partials is not None
    return EvalScores(
        reward=policy.reward,
        score=policy.score - base.score,
        score_partial=policy.score_partial - base.score_partial if partial else None,
        tasks={t: policy.tasks[t] - base.tasks[t] for t in policy.tasks},
        tasks_partial={t: policy.tasks_partial[t] - base.tasks_partial[t] for t in policy.tasks} if partial else None,
        images=dict(policy.images),
        prompt_scores=minus(policy.prompt_scores, base.prompt_scores),
        prompt_partials=minus(policy.prompt_partials, base.prompt_partials) if partial else None,
        intervals=paired(policy.prompt_scores, base.prompt_scores),
        intervals_partial=paired(policy.prompt_partials, base.prompt_partials) if partial else None,
    )
