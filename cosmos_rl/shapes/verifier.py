"""The shapes verifier: does an image show exactly what its caption asks for?

A caption's constraints are one per requested object plus one for its relation, if any; every
object seen that no requested object claims (an *extra*) adds one more, failed, constraint:

- a requested object is met when a distinct object of its shape (and colour, if the caption
  names one) is in the image; captions naming a colour claim objects first, so "a circle and
  a red circle" with one red and one blue circle meets both;
- a relation "A <rel> B" is met when some object that could be A and another that could be B
  satisfy :func:`cosmos_rl.shapes.spec.relation_holds`;
- ``partial`` = met / (requested + relation + extras); ``strict`` = 1 when nothing failed.

Counting extras is what keeps partial credit honest: without them an image full of blobs of
every colour would meet most "a red circle"-style constraints.

Worked examples (each extra object or unmet constraint is one failure):

- "two red circles", image with 3 red circles: 2 met, 1 extra -> partial 2/3, strict 0;
- "a red circle", image with one blue circle: 0 met, 1 extra -> 0/2;
- "a blue square to the left of a yellow triangle" with the two swapped: both objects met,
  relation failed -> 2/3;
- "a circle and a square", image with a circle only: 1 met of 2 -> 1/2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmos_rl.shapes.analyse import COLOUR_TOLERANCE, Found, check_batch, detect
from cosmos_rl.shapes.caption import parse_caption, task_of
from cosmos_rl.shapes.spec import TASKS, Group, Spec, relation_holds
from cosmos_rl.shapes.tasks import mean_by_task


@dataclass(frozen=True)
class Verdict:
    """How one image fared against its caption; ``failures`` says what failed, in words."""

    met: int
    total: int
    failures: tuple[str, ...]

    @property
    def partial(self) -> float:
        return self.met / self.total

    @property
    def strict(self) -> float:
        return 1.0 if self.met == self.total else 0.0


def _fits(group: Group, obj: Found) -> bool:
    return obj.shape == group.shape and (group.colour is None or obj.colour == group.colour)


def judge(spec: Spec, found: Sequence[Found], height: int, width: int) -> Verdict:
    """The verdict for one image's objects ``found`` under ``spec`` (see the module docstring)."""
    claimed: set[int] = set()
    failures = []
    met = 0
    # Coloured groups first: an object a coloured group can claim fits the uncoloured group of
    # its shape too, so claiming greedily in this order matches as many objects as possible.
    for group in sorted(spec.groups, key=lambda g: g.colour is None):
        fitting = [i for i, obj in enumerate(found) if i not in claimed and _fits(group, obj)]
        taken = fitting[: group.count]
        claimed.update(taken)
        met += len(taken)
        if len(taken) < group.count:
            failures.append(f"missing {group.count - len(taken)} of {group.phrase()!r}")
    total = spec.n_objects
    if spec.relation is not None:
        total += 1
        first, second = spec.groups
        holds = any(
            i != j and relation_holds((a.x, a.y), (b.x, b.y), spec.relation, height, width)
            for i, a in enumerate(found) if _fits(first, a)
            for j, b in enumerate(found) if _fits(second, b)
        )
        if holds:
            met += 1
        else:
            failures.append(f"relation {spec.relation!r} does not hold")
    extras = [obj for i, obj in enumerate(found) if i not in claimed]
    failures += [f"extra {obj.describe()}" for obj in extras]
    return Verdict(met, total + len(extras), tuple(failures))


def parse_all(captions: Sequence[str], count: int, what: str, parse: Callable[[str], Any]) -> list:
    """Every caption parsed by ``parse`` before any picture is looked at (either world's), so a
    caption outside the world fails the whole batch with a CaptionError (a ValueError) that quotes
    it; a ValueError unless there is one caption for each of the ``count`` ``what`` (images, clips)."""
    if len(captions) != count:
        raise ValueError(f"got {count} {what} but {len(captions)} captions")
    return [parse(caption) for caption in captions]


def verify(images: np.ndarray, captions: Sequence[str], tolerance: float = COLOUR_TOLERANCE) -> list[Verdict]:
    """One verdict per uint8 [N, H, W, 3] image and its caption (every caption parsed first: :func:`parse_all`)."""
    check_batch(images)
    specs = parse_all(captions, images.shape[0], "images", parse_caption)
    height, width = images.shape[1:3]
    return [judge(spec, found, height, width) for spec, found in zip(specs, detect(images, tolerance))]


def shapes_strict(images: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """1.0 when the image shows exactly what the caption asks for, else 0.0 (GenEval's rule)."""
    return [verdict.strict for verdict in verify(images, prompts)]


def shapes_partial(images: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """The fraction of the caption's constraints met, extra objects counting as failed ones."""
    return [verdict.partial for verdict in verify(images, prompts)]


def scores_by_task(captions: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """{task: mean score} over the tasks present, in TASKS order.

    ["a circle", "a square", "two circles"] with scores [1, 0, 1] -> {"single_object": 0.5,
    "counting": 1.0}.
    """
    return mean_by_task(captions, scores, task_of, TASKS)


def overall_score(task_scores: dict[str, float]) -> float:
    """GenEval's headline: the unweighted mean of the per-task scores ({"a": 1, "b": 0.5} -> 0.75)."""
    if not task_scores:
        raise ValueError("no task scores to average")
    return sum(task_scores.values()) / len(task_scores)
