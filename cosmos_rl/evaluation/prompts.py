"""Which images an evaluation makes: prompts x seeds, the same for every call. Torch-free.

The default prompts are the shapes world's held-out captions (`split_prompts(seed=0)`, the split
`python -m cosmos_rl.shapes prompts DIR` writes by default), at most `per_task` of each task,
evenly spread over the task's list so that every kind of prompt is represented (0 = all 319). A
prompt file gives every prompt of the file in file order instead.

An item is (caption, seed index); items run seed-major (every caption under seed 0, then under
seed 1, ...). Ranks split the items round-robin, each share padded to the same length with
items that count for nothing, so every rank runs the same number of sampler calls (FSDP2's
forwards are collective).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TypeVar

DEFAULT_PER_TASK = 8
DEFAULT_SEEDS = 2
SPLIT_SEED = 0

T = TypeVar("T")


@dataclass(frozen=True)
class Item:
    index: int  # position in the evaluation's item list
    caption: str
    seed: int  # seed index 0 .. seeds-1
    prompt: int  # the caption's position in the prompt list (a prompt's images are its seeds)


def spread(values: Sequence[T], k: int) -> list[T]:
    """`k` evenly spread elements of `values` (all of them when k is 0 or >= len).

    The i-th pick is values[(2i + 1) * n // (2k)], the middle of the i-th of k equal slices:
    spread(range(10), 3) -> [1, 5, 8]; spread("abc", 1) -> ["b"].
    """
    n = len(values)
    if k <= 0 or k >= n:
        return list(values)
    return [values[(2 * i + 1) * n // (2 * k)] for i in range(k)]


def held_out_captions(per_task: int = DEFAULT_PER_TASK, video: bool = False) -> list[str]:
    """The shapes world's held-out captions (the moving-shapes world's for video), up to `per_task`
    per task (0 = all), in task order."""
    if video:
        from cosmos_rl.shapes.motion_spec import MOTION_TASKS
        from cosmos_rl.shapes.motion_world import split_motion_prompts

        motion = split_motion_prompts(SPLIT_SEED)
        return [spec.caption() for task in MOTION_TASKS for spec in spread(motion.held_out[task], per_task)]
    from cosmos_rl.shapes import TASKS, split_prompts

    split = split_prompts(SPLIT_SEED)
    return [spec.caption() for task in TASKS for spec in spread(split.held_out[task], per_task)]


def eval_captions(prompts_file: str | Path | None, per_task: int, video: bool = False) -> tuple[list[str], str]:
    """(captions, a description for people) of a prompt file, or of the held-out default."""
    if prompts_file:
        from cosmos_rl.data.prompt_file import load_prompts

        return load_prompts(prompts_file), f"every prompt of {prompts_file}"
    captions = held_out_captions(per_task, video)
    amount = "every prompt" if per_task <= 0 else f"up to {per_task} per task"
    world = "moving-shapes" if video else "shapes"
    return captions, f"{world} held-out prompts (split seed {SPLIT_SEED}), {amount}"


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


def _canonical(caption: str) -> str:
    from cosmos_rl.shapes import CaptionError, parse_caption
    from cosmos_rl.shapes.motion_caption import parse_motion_caption

    for parse in (parse_caption, parse_motion_caption):
        try:
            return parse(caption).canonical().caption()
        except CaptionError:
            continue
    return " ".join(caption.lower().split())


def overlap(train_prompts: Sequence[str], captions: Sequence[str]) -> list[str]:
    """Evaluation captions that are training prompts, rewordings included ("a circle and a square" is
    "a square and a circle"); an evaluation on them measures memory, not generalisation."""
    seen = {_canonical(p) for p in train_prompts}
    return [c for c in captions if _canonical(c) in seen]

