"""How sure an evaluation's scores are: 95% percentile bootstrap intervals over prompts. Pure numpy.

The unit resampled is the **prompt**, not the image: a prompt's score is the mean over its seeds
(its images share a caption, so they are not independent draws), and the question an interval
answers is "how would the score move on other prompts like these". Every input here is one
number per prompt, whatever made it (an image, a clip), grouped by task.

The rules (docs/eval.md states the same):

* **per task**: draw the task's `n` prompts `n` times with replacement, take the mean; repeat
  `RESAMPLES` times; the interval is the 2.5th and 97.5th percentile of those means (numpy's
  default linear interpolation between order statistics);
* **overall** (the unweighted mean of the task means, GenEval's rule): stratified, each resample
  draws within every task as above and takes the mean of the resampled task means, so a task of
  one prompt adds no width and a task never borrows prompts from another;
* **paired difference** (a checkpoint against its base on identical noise): per prompt,
  checkpoint minus base, bootstrapped with the very draws both scores use, so the prompt-to-prompt
  spread that the two share cancels.

Draws are fixed: a task's draws come from a generator seeded by (`BOOTSTRAP_SEED`, the CRC-32 of
the task's name), so they depend only on the task and its prompt count. Two evaluations of the
same prompts resample the same prompts, a task's interval does not move when other tasks are
added, and `eval.json` repeats exactly.

Worked example (tests/test_intervals.py): a task of ten prompts, five scoring 1 and five 0. A
resample's mean is k/10 with k ~ Binomial(10, 1/2); P(k <= 1) = 11/1024 ~ 1.1% and P(k <= 2) =
56/1024 ~ 5.5%, so the 2.5th percentile is 0.2 and, by symmetry, the 97.5th is 0.8: [0.2, 0.8].
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

RESAMPLES = 2000  # percentiles at 2.5 / 97.5 then rest on ~50 resamples each side
BOOTSTRAP_SEED = 0
LEVEL = 0.95

Interval = tuple[float, float]


@dataclass(frozen=True)
class Intervals:
    """The intervals of one set of per-prompt scores: the overall score's and each task's."""

    overall: Interval
    tasks: dict[str, Interval]


def settings() -> dict:
    """What eval.json records about the bootstrap, so a reader can repeat it."""
    return {
        "over": "prompts (a prompt's score is the mean over its seeds)", "level": LEVEL, "resamples": RESAMPLES,
        "seed": BOOTSTRAP_SEED, "method": "percentile", "overall": "stratified by task: the mean of the resampled task means",
    }  # fmt: skip


def draws(task: str, n: int, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[resamples, n] prompt indices of a task's resamples (with replacement), fixed by (seed, task, n)."""
    if n < 1:
        raise ValueError(f"task {task!r}: a bootstrap needs at least one prompt")
    rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(task.encode("utf-8"))]))
    return rng.integers(0, n, size=(resamples, n))


def _bounds(means: np.ndarray) -> Interval:
    tail = (1.0 - LEVEL) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap(by_task: Mapping[str, np.ndarray], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Intervals:
    """Intervals of per-prompt scores `{task: [n_task]}` (see the module docstring for the rules)."""
    if not by_task:
        raise ValueError("a bootstrap needs at least one task")
    means = {}
    for task, scores in by_task.items():
        values = np.asarray(scores, dtype=np.float64)
        if values.ndim != 1:
            raise ValueError(f"task {task!r}: one score per prompt expected, got shape {values.shape}")
        means[task] = values[draws(task, len(values), resamples, seed)].mean(axis=1)  # [resamples]
    overall = np.mean(np.stack(list(means.values())), axis=0)
    return Intervals(overall=_bounds(overall), tasks={task: _bounds(m) for task, m in means.items()})


def paired(
    policy: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> Intervals:
    """Intervals of the difference policy - base, prompt by prompt (the same prompts, in the same order)."""
    if list(policy) != list(base):
        raise ValueError(f"paired scores need the same tasks: {list(policy)} against {list(base)}")
    diff = {}
    for task in policy:
        a, b = np.asarray(policy[task], dtype=np.float64), np.asarray(base[task], dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"task {task!r}: {a.shape} policy scores against {b.shape} base scores")
        diff[task] = a - b
    return bootstrap(diff, resamples, seed)


def cell(value: float | None, interval: Sequence[float] | None, signed: bool = False) -> str:
    """A score for people: `0.500 [0.42, 0.58]`, a difference `+0.100 [0.06, 0.14]` (its sign on the
    value; a bound shows its sign only when negative); the bounds at two decimals, as far as a few
    hundred prompts can tell them; without an interval (an older eval.json) the value alone; `n/a`
    without a value."""
    if value is None:
        return "n/a"
    if signed and round(value, 3) == 0:
        value = 0.0  # no "-0.000"
    text = f"{value:+.3f}" if signed else f"{value:.3f}"
    if interval is None:
        return text
    lo, hi = (0.0 if round(b, 2) == 0 else b for b in interval)
    return f"{text} [{lo:.2f}, {hi:.2f}]"
