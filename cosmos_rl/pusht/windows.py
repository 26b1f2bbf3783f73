"""Push-T training windows named by a key: the prompt rows of an online world-model run.

A key `pusht window seed=S task=T episode=I start=K length=L` names window K.. of episode I of
maker T (`planner`, `random`: `episodes.planner_episode`, `episodes.random_episode`), `L` frames
long, from the env's start for seed (S, task number, I): the held-out split of the `pusht` suite
(`suites/pusht.py`) is built the same way from `HELD_OUT_SEED`, which a key may not use. Both
makers are deterministic, so any process (a rank, the reward service) rebuilds the same window
from the key alone; `key_episode` keeps the last 256 episodes built.
"""

from __future__ import annotations

from functools import lru_cache

HELD_OUT_SEED = 50_000  # suites/pusht.SPLIT_SEED: the held-out split (a test checks they agree)
MAKERS = ("planner", "random")  # suites/pusht.TASKS, in the same order (the task number seeds the episode)
TRAIN_LENGTH = 30  # frames per training episode unless a key says otherwise (as the held-out episodes)
_KEY = "pusht window seed={seed} task={task} episode={episode} start={start} length={length}"
_KEY_PATTERN = r"pusht window seed=(\d+) task=(\w+) episode=(\d+) start=(\d+) length=(\d+)"
MAX_KEY_LENGTH = 1000  # frames: a key past it would build an episode no window needs


def window_key(seed: int, task: str, episode: int, start: int, length: int = TRAIN_LENGTH) -> str:
    """The key of a training window (module docstring)."""
    return _KEY.format(seed=int(seed), task=task, episode=int(episode), start=int(start), length=int(length))


def parse_key(key: str) -> tuple[int, str, int, int, int]:
    """(seed, task, episode, start, length) of a training window's key; ValueError naming the problem."""
    import re

    match = re.fullmatch(_KEY_PATTERN, key.strip())
    if match is None:
        raise ValueError(f"{key!r} is not a Push-T window key ({_KEY.format(seed='S', task='planner|random', episode='I', start='K', length='L')})")
    seed, task, episode, start, length = match.groups()
    seed, episode, start, length = int(seed), int(episode), int(start), int(length)
    if task not in MAKERS:
        raise ValueError(f"{key!r}: task {task!r} is not one of {', '.join(MAKERS)}")
    if seed == HELD_OUT_SEED:
        raise ValueError(f"{key!r}: seed {HELD_OUT_SEED} is the held-out split, which no training run may use; use another seed")
    if not 2 <= length <= MAX_KEY_LENGTH:
        raise ValueError(f"{key!r}: length must be in [2, {MAX_KEY_LENGTH}] frames")
    return seed, task, episode, start, length


def training_keys(episodes: int, seed: int, chunk: int, length: int = TRAIN_LENGTH, stride: int = 1) -> list[str]:
    """The keys of every `stride`-th window of `chunk + 1` frames of `episodes` episodes per task
    (planner first), episode seed `seed` (never `HELD_OUT_SEED`)."""
    if seed == HELD_OUT_SEED:
        raise ValueError(f"seed {HELD_OUT_SEED} is the held-out split; use another seed")
    if episodes < 1 or chunk < 1 or stride < 1 or length <= chunk:
        raise ValueError(f"need episodes >= 1, chunk >= 1, stride >= 1 and length > chunk, got {episodes}, {chunk}, {stride}, {length}")
    return [window_key(seed, task, i, start, length) for task in MAKERS for i in range(episodes) for start in range(0, length - chunk, stride)]


@lru_cache(maxsize=256)
def key_episode(seed: int, task: str, episode: int, length: int, size: tuple[int, int]):
    """The training episode a key names (cached: a group's rollouts and every step share it)."""
    import numpy as np

    from cosmos_rl.pusht.episodes import planner_episode, random_episode

    number = MAKERS.index(task)
    episode_seed = int(np.random.SeedSequence([seed, number, episode]).generate_state(1)[0])
    return (planner_episode, random_episode)[number](episode, episode_seed, length, size)
