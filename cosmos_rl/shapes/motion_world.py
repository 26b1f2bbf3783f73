"""Every prompt of the moving-shapes world, by task, and the seeded train / held-out split.

Prompt counts per task (6 colours, 3 shapes, 4 directions; an object without a named colour is
one of 3 "bare" objects, with one one of 18 coloured ones, 21 in all):

- motion 84 (21 objects x 4 directions);
- two_motions 3312 (276 ordered pairs of objects told apart, 6 bare + 18 x 15 coloured, x 12
  ordered pairs of different directions), 1656 meanings;
- static 2505: 21 objects staying still, and 276 ordered pairs x 9 (still and still, still and
  one of 4 directions, one of 4 directions and still), 21 + 1242 meanings;
- colour_change 90 (3 shapes x 6 x 5 ordered pairs of different colours);
- counting_motion 168 (2 counts x 21 objects x 4 directions);
- turn 252 (21 objects x 12 ordered pairs of different directions).

The split is made on meanings (:meth:`MotionSpec.canonical`): "A and B" and "B and A" always
land on the same side, so no held-out prompt is a rewording of a training one. Each task holds out
``per_task`` meanings (40 by default, every spelling of each), so each task's held-out score is a
mean over at least 40 prompts. The draw is seeded and repeated (with the next sub-seed) until
every word the task uses (shape, colour, direction, count) is still in the task's training
prompts, so a held-out prompt is a new combination of words the model was trained on.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Union

import numpy as np

from cosmos_rl.shapes.motion_caption import parse_motion_caption
from cosmos_rl.shapes.motion_spec import DIRECTIONS, MOTION_TASKS, Clause, MotionSpec
from cosmos_rl.shapes.prompt_files import write_spec_file
from cosmos_rl.shapes.spec import COLOURS, SHAPES, Group
from cosmos_rl.shapes.tasks import TaskSplit, balanced_by_task, split_on_meanings

HELD_OUT_PER_TASK = 40
_MAX_DRAWS = 1000


def _objects() -> list[Group]:
    return [Group(s) for s in SHAPES] + [Group(s, c) for s in SHAPES for c in COLOURS]


def _pairs() -> list[tuple[Group, Group]]:
    """Ordered pairs of single objects the verifier tells apart (as MotionSpec requires)."""
    bare = [(a, b) for a, b in itertools.permutations([Group(s) for s in SHAPES], 2)]
    coloured = [(a, b) for a, b in itertools.permutations([Group(s, c) for s in SHAPES for c in COLOURS], 2)
                if a.colour != b.colour]
    return bare + coloured


def all_motion_specs(task: str) -> list[MotionSpec]:
    """Every spec of ``task`` (one per distinct caption), in a fixed order."""
    moves = [("move", (d,)) for d in DIRECTIONS]
    if task == "motion":
        return [MotionSpec((Clause(g, *m),)) for g in _objects() for m in moves]
    if task == "two_motions":
        return [MotionSpec((Clause(a, "move", (da,)), Clause(b, "move", (db,))))
                for a, b in _pairs() for da, db in itertools.permutations(DIRECTIONS, 2)]
    if task == "static":
        still = ("still", ())
        actions = [(still, still)] + [(still, m) for m in moves] + [(m, still) for m in moves]
        return [MotionSpec((Clause(g, *still),)) for g in _objects()] + [
            MotionSpec((Clause(a, *x), Clause(b, *y))) for a, b in _pairs() for x, y in actions]
    if task == "colour_change":
        return [MotionSpec((Clause(Group(s), "change", pair),)) for s in SHAPES
                for pair in itertools.permutations(COLOURS, 2)]
    if task == "counting_motion":
        return [MotionSpec((Clause(Group(g.shape, g.colour, n), *m),)) for n in (2, 3) for g in _objects()
                for m in moves]
    if task == "turn":
        return [MotionSpec((Clause(g, "turn", pair),)) for g in _objects() for pair in itertools.permutations(DIRECTIONS, 2)]
    raise ValueError(f"unknown video task {task!r}; tasks are {MOTION_TASKS}")


def words_of(spec: MotionSpec) -> set[str]:
    """The words a spec's meaning is made of: shapes, colours (named or changed to), directions, counts."""
    words = set()
    for clause in spec.clauses:
        g = clause.group
        words |= {g.shape, f"count {g.count}", clause.action, *clause.args}
        if g.colour:
            words.add(g.colour)
    return words


class MotionSplit(TaskSplit):
    """Training and held-out video specs by task (MOTION_TASKS order); no caption on both sides."""

    tasks = MOTION_TASKS


def split_motion_prompts(seed: int = 0, per_task: int = HELD_OUT_PER_TASK) -> MotionSplit:
    """The world's video prompts split by task; the same (seed, per_task) always gives the same split.

    Every task holds out ``per_task`` meanings, chosen uniformly by the seed among the draws that
    leave each of the task's words in training (module docstring).
    """
    if per_task < 1:
        raise ValueError(f"held-out meanings per task must be at least 1, got {per_task}")

    def choose(task: str, canon: list[MotionSpec]) -> set[MotionSpec]:
        if per_task >= len(canon):
            raise ValueError(f"task {task!r} has {len(canon)} meanings; cannot hold out {per_task}")
        every_word = set().union(*(words_of(s) for s in canon))
        for draw in range(_MAX_DRAWS):
            rng = np.random.default_rng([int(seed), zlib.crc32(("video:" + task).encode()), draw])
            order = rng.permutation(len(canon))
            if set().union(*(words_of(canon[i]) for i in order[per_task:])) == every_word:
                return {canon[i] for i in order[:per_task]}
        raise ValueError(f"no split of task {task!r} holding out {per_task} keeps every word in training")

    return MotionSplit(*split_on_meanings(MOTION_TASKS, all_motion_specs, choose))


def balanced_motion(specs_by_task: dict[str, tuple[MotionSpec, ...]], n: int, seed: int) -> list[MotionSpec]:
    """``n`` specs taking the tasks in turn (MOTION_TASKS order), each task cycling through its
    specs in a seeded shuffled order, reshuffled on every pass (as the image world's ``balanced``)."""
    return balanced_by_task(specs_by_task, n, seed, MOTION_TASKS, "video specs")


def write_motion_prompt_file(path: Union[str, Path], prompts: Sequence[Union[MotionSpec, str]]) -> Path:
    """Write video ``prompts`` (specs or captions, in order) to ``path`` (.txt or .jsonl), replacing it.

    A ``.jsonl`` row is ``{"prompt", "task", "spec", "frame_caption"}``; the project's prompt
    loader reads ``prompt`` and ignores the rest (``frame_caption`` is null for a colour change).
    """
    return write_spec_file(path, prompts, MotionSpec, parse_motion_caption, lambda s: {
        "prompt": s.caption(), "task": s.task, "spec": s.to_dict(), "frame_caption": s.frame_caption()})
