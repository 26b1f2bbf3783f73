"""`[rl.eval]` during training: which steps evaluate, the `eval/` metrics, the reward-hacking watch.

`with_eval` wraps the step and held-out functions a trainer hands to `trainers.loop.run_steps`:
after every `rl.eval.every`-th step it calls the trainer's `evaluate(step)` (which samples and
scores the evaluation items on every rank and returns the group's `eval/` metrics, the same on
every rank) and adds its metrics to the step's row. The watch (`evaluation.hacking`) gets the
training signal's and each reward dimension's (`train/<name>/reward_mean`, a run of several
rewards) per-step values since the previous evaluation and the evaluation's per-prompt scores
(which the evaluation hands over under `scores.PROMPT_KEY` keys, taken out of the row here); with
`rl.eval.gold` the gold reward's score and per-prompt scores (`scores.GOLD_KEY`) instead. With
`rl.eval.stop_on_hacking` a warning also asks the step loop to stop (`halt`): it commits the step's
checkpoint and ends with `HackingStopped` (exit 3). The watch starts afresh on resume. Torch-free:
the NFT driver runs it.
"""

from __future__ import annotations

import re
from typing import Callable

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.evaluation.hacking import Evaluation, HackingWatch
from cosmos_rl.evaluation.scores import GOLD_KEY, split_prompt_scores

Metrics = dict[str, float]
# A reward dimension's per-step mean on a run of several rewards (algorithms.multi_reward.reward_metric_names).
DIMENSION = re.compile(r"^train/([^/]+)/reward_mean$")


class TrainingEval:
    def __init__(self, config: schema.RunConfig, evaluate: Callable[[int], Metrics], *, main: bool, console=None):
        cfg = config.rl.eval
        self.every, self.evaluate, self.main = cfg.every, evaluate, main
        # The training reward the algorithm logs (its registry entry's train_signal): DPO's implicit
        # one is the margin; SFT has none, so its watch sees no signal and never warns.
        self.signal_name = algorithms.of(config).train_signal
        # The held-out reference: rl.eval.gold's score when set (a judge distinct from the training
        # reward), else eval/score.
        self.gold = cfg.gold
        self.watch = HackingWatch(cfg.hacking_window, self.signal_name, f"eval/gold ({cfg.gold})" if cfg.gold else "eval/score")
        self.stop_on_hacking = cfg.stop_on_hacking
        self.warnings: list[str] = []
        self.stop_reason: str | None = None  # the first warning, with rl.eval.stop_on_hacking
        self._since: list[float] = []
        self._dims: dict[str, list[float]] = {}
        self._console = console

    def wrap_step(self, step_fn: Callable[[int], Metrics]) -> Callable[[int], Metrics]:
        def step(index: int) -> Metrics:
            metrics = step_fn(index)
            if self.signal_name in metrics:
                self._since.append(float(metrics[self.signal_name]))
            for key, value in metrics.items():
                found = DIMENSION.match(key)
                if found:
                    self._dims.setdefault(found.group(1), []).append(float(value))
            return metrics

        return step

    def holdout(self, step: int) -> Metrics:
        if self.every <= 0 or step % self.every:
            return {}
        metrics, prompts = split_prompt_scores(self.evaluate(step))
        metrics, gold = split_prompt_scores(metrics, GOLD_KEY)
        if not prompts or bool(gold) != bool(self.gold):
            raise AssertionError("an evaluation during training returns its per-prompt scores (EvalScores.watched, scores.gold_metrics)")
        score, prompts = (metrics["eval/gold"], gold) if self.gold else (metrics["eval/score"], prompts)
        seen = Evaluation(step, tuple(self._since), score, prompts, {k: tuple(v) for k, v in self._dims.items()})
        self._since, self._dims = [], {}
        for line in self.watch.observe(seen):
            self.warnings.append(line)
            if self.stop_on_hacking and self.stop_reason is None:
                self.stop_reason = f"step {step}: {line}"
            if self.main:
                self._warn(f"step {step}: {line}")
        return metrics

    def halt(self) -> str | None:
        """The warning that stops the run (rl.eval.stop_on_hacking), else None; the step loop asks after each step."""
        return self.stop_reason

    def _warn(self, line: str) -> None:
        from rich.console import Console

        console = self._console or Console(stderr=True, soft_wrap=True)
        console.print("[yellow]warning[/]: ", end="", highlight=False)
        console.print(line, markup=False, highlight=False)


def never() -> str | None:
    return None


def with_eval(
    config: schema.RunConfig, step_fn: Callable[[int], Metrics], holdout_fn: Callable[[int], Metrics] | None,
    evaluate: Callable[[int], Metrics], *, main: bool, console=None,
) -> tuple[Callable[[int], Metrics], Callable[[int], Metrics] | None, Callable[[], str | None]]:  # fmt: skip
    """(step_fn, holdout_fn, halt) for run_steps with `[rl.eval]` added: `halt()` is the warning
    that stops the run (rl.eval.stop_on_hacking) or None; unchanged (and never halting) when
    rl.eval.every is 0."""
    if config.rl.eval.every <= 0:
        return step_fn, holdout_fn, never
    hook = TrainingEval(config, evaluate, main=main, console=console)
    if main:
        line = overlap_note(config)
        if line:
            hook._warn(line)

    def holdout(step: int) -> Metrics:
        metrics = dict(holdout_fn(step)) if holdout_fn is not None else {}
        metrics.update(hook.holdout(step))
        return metrics

    return hook.wrap_step(step_fn), holdout, hook.halt


def overlap_note(config: schema.RunConfig) -> str | None:
    """A warning when a run's training prompts (an online run's: NFT's) include evaluation prompts
    (rewordings count)."""
    from cosmos_rl.config.run_suite import run_suite
    from cosmos_rl.evaluation.prompts import eval_captions, overlap

    rl = config.rl
    prompts_of = algorithms.of(config).resolve("train_prompts")
    if prompts_of is None:
        return None
    train = prompts_of(rl)
    suite = run_suite(config)  # the run's evaluation prompts: a video run's are its clip suite's
    captions, _ = eval_captions(rl.eval.prompts, rl.eval.per_task, suite)
    seen = overlap(train, captions, suite)
    if not seen:
        return None
    return (f"rl.eval: {len(seen)} of the {len(captions)} evaluation prompts are training prompts (e.g. {seen[0]!r}); "
            "eval/ then measures memory, not generalisation")  # fmt: skip
