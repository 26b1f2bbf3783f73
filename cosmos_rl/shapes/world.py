"""Every prompt of the world, by task, and the seeded split into training and held-out prompts.

Prompt counts per task (6 colours, 3 shapes): single_object 3, colours 18, counting 42 (two or
three of a shape, with or without a colour), two_objects 6 ("a circle and a square" and its
reordering), colour_attribution 270 (two objects of different colours), position 1248 (two
distinguishable objects, coloured or not, in four relations).

The split is made on canonical specs (:meth:`Spec.canonical`), so "a square and a circle" and
"a circle and a square", or "A left of B" and "B right of A", always land on the same side:
no held-out prompt is a rewording of a training prompt. Each task holds out ``fraction`` of its
canonical specs (at least one, and at least one stays for training), chosen by ``seed``.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np

from cosmos_rl.shapes.spec import COLOURS, RELATION_WORDS, SHAPES, TASKS, Group, Spec
from cosmos_rl.shapes.tasks import TaskSplit, balanced_by_task, split_on_meanings

HELD_OUT_FRACTION = 0.2


def _objects(coloured: bool) -> list[Group]:
    return [Group(s, c) for s in SHAPES for c in COLOURS] if coloured else [Group(s) for s in SHAPES]


def all_specs(task: str) -> list[Spec]:
    """Every spec of ``task`` (one per distinct caption), in a fixed order."""
    if task == "single_object":
        return [Spec((g,)) for g in _objects(False)]
    if task == "colours":
        return [Spec((g,)) for g in _objects(True)]
    if task == "counting":
        return [Spec((Group(g.shape, g.colour, n),)) for n in (2, 3) for g in _objects(False) + _objects(True)]
    if task == "two_objects":
        return [Spec((a, b)) for a, b in itertools.permutations(_objects(False), 2)]
    if task == "colour_attribution":
        return [Spec((a, b)) for a, b in itertools.permutations(_objects(True), 2) if a.colour != b.colour]
    if task == "position":
        pairs = itertools.chain(itertools.permutations(_objects(False), 2), itertools.permutations(_objects(True), 2))
        return [Spec((a, b), relation) for a, b in pairs for relation in RELATION_WORDS]
    raise ValueError(f"unknown task {task!r}; tasks are {TASKS}")


class PromptSplit(TaskSplit):
    """Training and held-out specs by task (every task in TASKS order); no caption on both sides."""

    tasks = TASKS


def split_prompts(seed: int = 0, fraction: float = HELD_OUT_FRACTION) -> PromptSplit:
    """The world's prompts split by task; the same (seed, fraction) always gives the same split.

    With the default fraction, held out per task: single_object 1 of 3 canonical specs,
    two_objects 1 of 3, colours 4 of 18, counting 8 of 42, colour_attribution 27 of 135,
    position 125 of 624 (round(0.2 * n), at least 1).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"held-out fraction must be in (0, 1), got {fraction}")

    def choose(task: str, canon: list[Spec]) -> set[Spec]:
        n_held = min(len(canon) - 1, max(1, int(np.floor(fraction * len(canon) + 0.5))))
        rng = np.random.default_rng([int(seed), zlib.crc32(task.encode())])
        return {canon[i] for i in rng.permutation(len(canon))[:n_held]}

    return PromptSplit(*split_on_meanings(TASKS, all_specs, choose))


def balanced(specs_by_task: dict[str, tuple[Spec, ...]], n: int, seed: int) -> list[Spec]:
    """``n`` specs taking the tasks in turn (TASKS order), each task cycling through its specs in
    a seeded shuffled order, reshuffled on every pass: every task gets n/6 (+1) of the specs.

    Used for SFT shards and training prompt files so that position, with 30x the prompts of
    counting, does not drown the small tasks.
    """
    return balanced_by_task(specs_by_task, n, seed, TASKS)
