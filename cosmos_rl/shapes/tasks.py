"""Prompts by task, for either world: the train / held-out split made on meanings, the
task-balanced draw and per-task means of scores.

The image world (:mod:`cosmos_rl.shapes.world`, TASKS) and the moving-shapes world
(:mod:`cosmos_rl.shapes.motion_world`, MOTION_TASKS) differ only in their tasks, their specs and
how a task's held-out meanings are chosen; a spec here is anything with ``caption()``,
``canonical()`` and ``task``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class TaskSplit:
    """Training and held-out specs by task (every task of ``tasks``, in order); no caption on both sides."""

    train: dict[str, tuple[Any, ...]]
    held_out: dict[str, tuple[Any, ...]]
    tasks: ClassVar[tuple[str, ...]] = ()  # the world's tasks, set by each world's split class

    def train_captions(self) -> list[str]:
        return [spec.caption() for task in self.tasks for spec in self.train[task]]

    def held_out_captions(self) -> list[str]:
        return [spec.caption() for task in self.tasks for spec in self.held_out[task]]


def split_on_meanings(
    tasks: Sequence[str], all_specs: Callable[[str], list], choose: Callable[[str, list], set]
) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(train, held_out) by task: ``choose(task, meanings)`` picks the task's held-out meanings
    (canonical specs, sorted by caption), and every spelling of a meaning goes to its side."""
    train: dict[str, tuple] = {}
    held_out: dict[str, tuple] = {}
    for task in tasks:
        specs = all_specs(task)
        canon = sorted({spec.canonical() for spec in specs}, key=lambda s: s.caption())
        chosen = choose(task, canon)
        held_out[task] = tuple(spec for spec in specs if spec.canonical() in chosen)
        train[task] = tuple(spec for spec in specs if spec.canonical() not in chosen)
    return train, held_out


def balanced_by_task(specs_by_task: dict[str, tuple], n: int, seed: int, tasks: Sequence[str], what: str = "specs") -> list:
    """``n`` specs taking ``tasks`` in turn (those with specs), each task cycling through its specs
    in a seeded shuffled order, reshuffled on every pass; ``what`` names the specs in the error."""
    present = [task for task in tasks if specs_by_task.get(task)]
    if not present:
        raise ValueError(f"no {what} to draw from")
    rng = np.random.default_rng(int(seed))
    queues: dict[str, list] = {task: [] for task in present}
    out = []
    for i in range(n):
        task = present[i % len(present)]
        if not queues[task]:
            pool = specs_by_task[task]
            queues[task] = [pool[j] for j in rng.permutation(len(pool))]
        out.append(queues[task].pop())
    return out


def mean_by_task(captions: Sequence[str], scores: Sequence[float], task_of: Callable[[str], str],
                 tasks: Sequence[str]) -> dict[str, float]:  # fmt: skip
    """{task: mean score} over the tasks present, in ``tasks`` order (``task_of`` reads a caption's task)."""
    if len(captions) != len(scores):
        raise ValueError(f"got {len(captions)} captions but {len(scores)} scores")
    by_task: dict[str, list[float]] = defaultdict(list)
    for caption, score in zip(captions, scores):
        by_task[task_of(caption)].append(float(score))
    return {task: sum(by_task[task]) / len(by_task[task]) for task in tasks if task in by_task}
