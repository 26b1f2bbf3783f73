"""Which images an evaluation makes: prompts x seeds, the same for every call. Torch-free.

The default prompts are the evaluation suite's held-out captions (`Suite.held_out`: the shapes
suite's are the split `python -m cosmos_rl.shapes prompts DIR` writes by default), at most
`per_task` of each task, evenly spread over the task's list so that every kind of prompt is
represented (0 = all: 319 for the shapes suite). A prompt file gives every prompt of the file in
file order instead.

An item is (caption, seed index); items run seed-major (every caption under seed 0, then under
seed 1, ...). Ranks split the items round-robin, each share padded to the same length with
items that count for nothing, so every rank runs the same number of sampler calls (FSDP2's
forwards are collective).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cosmos_rl.suites.base import Suite, spread  # noqa: F401  (spread: the grid's columns pick the same way)

DEFAULT_PER_TASK = 8
DEFAULT_SEEDS = 2


@dataclass(frozen=True)
class Item:
    index: int  # position in the evaluation's item list
    caption: str
    seed: int  # seed index 0 .. seeds-1
    prompt: int  # the caption's position in the prompt list (a prompt's images are its seeds)


def held_out_captions(suite: Suite, per_task: int = DEFAULT_PER_TASK) -> list[str]:
    """The suite's held-out captions, up to `per_task` per task (0 = all), in task order."""
    return [caption for caption, _ in suite.held_out(per_task)]


def eval_captions(prompts_file: str | Path | None, per_task: int, suite: Suite) -> tuple[list[str], str]:
    """(captions, a description for people) of a prompt file, or of the suite's held-out default."""
    if prompts_file:
        from cosmos_rl.data.prompt_file import load_prompts

        return load_prompts(prompts_file), f"every prompt of {prompts_file}"
    captions = held_out_captions(suite, per_task)
    amount = "every prompt" if per_task <= 0 else f"up to {per_task} per task"
    return captions, f"{suite.held_out_title}, {amount}"


def make_items(captions: Sequence[str], seeds: int) -> list[Item]:
    """Every caption under every seed index, seed-major: ["a", "b"] x 2 -> a/0, b/0, a/1, b/1."""
    if not captions:
        raise ValueError("an evaluation needs at least one prompt")
    return [Item(s * len(captions) + i, caption, s, i) for s in range(seeds) for i, caption in enumerate(captions)]


def rank_share(items: Sequence[Item], rank: int, world: int) -> list[tuple[Item, bool]]:
    """Rank `rank`'s items as (item, counts): items[rank::world] padded with non-counting copies of
    item 0 to ceil(len / world), so every rank holds the same number.

    5 items over 2 ranks: rank 0 gets 0, 2, 4; rank 1 gets 1, 3 and a non-counting 0.
    """
    length = -(-len(items) // world)
    mine = [(item, True) for item in items[rank::world]]
    return mine + [(items[0], False)] * (length - len(mine))


def overlap(train_prompts: Sequence[str], captions: Sequence[str], suite: Suite) -> list[str]:
    """Evaluation captions that are training prompts, rewordings included (the suite's canonical
    spelling: "a circle and a square" is "a square and a circle"); an evaluation on them measures
    memory, not generalisation."""
    seen = {suite.canonical(p) for p in train_prompts}
    return [c for c in captions if suite.canonical(c) in seen]
