"""Scoring an evaluation's images, and the totals that add up across ranks. Torch-free.

With a shapes reward (`shapes_strict` or `shapes_partial`) the shapes verifier gives both scores
of every image: the headline `score` is strict (GenEval's rule), `score_partial` the fraction of
constraints met. Any other built-in reward gives one score per image (its value) and no partial.

A task's score is the mean over its images; the overall score is the unweighted mean of the task
scores (as GenEval averages). Prompts outside the shapes grammar (possible with a non-shapes
reward) form one task, `other`. Worked example, captions ["a circle", "a square", "two circles"]
scored strict [1, 0, 1] and partial [1, 0.5, 1]: tasks {single_object: 0.5, counting: 1.0},
score 0.75; partial tasks {single_object: 0.75, counting: 1.0}, score_partial 0.875.

Ranks hold `Totals` (per task: images, score sum, partial sum); totals add, so the ranks' shares
give the numbers one process scoring everything gives. Beside them, `PromptTotals` (the same sums
per prompt) feed the bootstrap intervals (`evaluation.intervals`): `with_intervals` attaches each
task's per-prompt scores and their intervals to an `EvalScores`, `difference` pairs a checkpoint's
with its base's. The prompt sums are reduced apart from the task sums, so adding them changes no
task score by a bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from cosmos_rl.config.preflight.rewards import VIDEO_REWARDS  # the moving-shapes verifier's, on clips
from cosmos_rl.evaluation.intervals import Intervals, bootstrap, paired
from cosmos_rl.shapes import TASKS, CaptionError, task_of, verify
from cosmos_rl.shapes.motion_caption import motion_task_of
from cosmos_rl.shapes.motion_spec import MOTION_TASKS

SHAPES_REWARDS = ("shapes_strict", "shapes_partial")
OTHER = "other"  # the task of a prompt outside the shapes grammar (non-shapes rewards only)
GROUPS = (*TASKS, *MOTION_TASKS, OTHER)
_PARTS = ("n", "score", "partial")


def uses_verifier(reward: str) -> bool:
    return reward in SHAPES_REWARDS or reward in VIDEO_REWARDS


def scores_clips(reward: str) -> bool:
    return reward in VIDEO_REWARDS


def default_reward(video: bool) -> str:
    """The verifier's strict score of the media: shapes_strict for images, shapes_video_strict for clips."""
    return VIDEO_REWARDS[0] if video else SHAPES_REWARDS[0]


def reward_names(video: bool = False) -> list[str]:
    """The rewards an evaluation may use: the built-in weight-free ones (of clips, for video)."""
    if video:
        return list(VIDEO_REWARDS)
    from cosmos_rl.rewards.functions import REWARDS

    return sorted(REWARDS)


def group_of(caption: str, reward: str) -> str:
    """The task a caption's images count under; with a shapes reward a caption must parse."""
    if scores_clips(reward):
        return motion_task_of(caption)
    if uses_verifier(reward):
        return task_of(caption)
    try:
        return task_of(caption)
    except CaptionError:
        return OTHER


def caption_groups(captions: Sequence[str], reward: str, origin: str) -> dict[str, str]:
    """{caption: task} for every caption, or a UserError naming `origin` and the prompt's number
    when a shapes reward meets a caption outside the shapes grammar."""
    from cosmos_rl.core.errors import UserError

    groups = {}
    for number, caption in enumerate(captions, start=1):
        try:
            groups[caption] = group_of(caption, reward)
        except CaptionError as exc:
            command = "video-prompts" if scores_clips(reward) else "prompts"
            raise UserError(
                f"{origin}: prompt {number}: {exc}; the shapes verifier ({reward}) scores shapes captions only: "
                f"use a shapes prompt file (python -m cosmos_rl.shapes {command} DIR) or another reward"
            ) from None
    return groups


def score_images(reward: str, images: np.ndarray, captions: Sequence[str]) -> tuple[list[float], list[float] | None]:
    """(score, partial or None) per uint8 [N, H, W, 3] image, or per [N, F, H, W, 3] clip with a
    video reward."""
    if scores_clips(reward):
        from cosmos_rl.shapes.motion_verifier import verify_clips

        verdicts = verify_clips(images, captions)
        return [v.strict for v in verdicts], [v.partial for v in verdicts]
    if uses_verifier(reward):
        verdicts = verify(images, captions)
        return [v.strict for v in verdicts], [v.partial for v in verdicts]
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


@dataclass
class Totals:
    """Per task: [images, score sum, partial sum]."""

    sums: dict[str, list[float]] = field(default_factory=lambda: {g: [0.0, 0.0, 0.0] for g in GROUPS})

    def add(self, group: str, score: float, partial: float | None) -> None:
        entry = self.sums[group]
        entry[0] += 1.0
        entry[1] += float(score)
        entry[2] += float(partial) if partial is not None else 0.0

    def as_dict(self) -> dict[str, float]:
        """Flat `{task/n, task/score, task/partial}` with every task present (the same keys on every rank)."""
        return {f"{g}/{part}": self.sums[g][i] for g in GROUPS for i, part in enumerate(_PARTS)}

    @classmethod
    def from_dict(cls, flat: dict[str, float]) -> "Totals":
        return cls({g: [float(flat[f"{g}/{part}"]) for part in _PARTS] for g in GROUPS})

    def __add__(self, other: "Totals") -> "Totals":
        return Totals({g: [a + b for a, b in zip(self.sums[g], other.sums[g])] for g in GROUPS})

    def scores(self, reward: str) -> EvalScores:
        present = [g for g in GROUPS if self.sums[g][0] > 0]
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
