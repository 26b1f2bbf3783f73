"""The score fields of `eval.json` (docs/eval.md), shared by a prompt suite's evaluation
(`commands.evaluate`) and an episode suite's (`commands.world_eval`), so both write them alike."""

from __future__ import annotations

from cosmos_rl.evaluation.scores import EvalScores


def _scores_json(scores: EvalScores | None, prefix: str) -> dict:
    if scores is None:
        return {f"{prefix}score": None, f"{prefix}score_partial": None, f"{prefix}tasks": None, f"{prefix}tasks_partial": None}
    return {
        f"{prefix}score": scores.score, f"{prefix}score_partial": scores.score_partial,
        f"{prefix}tasks": scores.tasks, f"{prefix}tasks_partial": scores.tasks_partial,
    }  # fmt: skip


def _prompt_scores_json(scores: EvalScores | None, prefix: str) -> dict:
    """`{prefix}prompt_scores: {task: [each prompt's mean over its seeds]}` (prompts in evaluation
    order) and `{prefix}prompt_partials` likewise: two evaluations on the same prompts and seeds pair
    on these."""
    listed = lambda by_task: {t: list(v) for t, v in by_task.items()} if by_task is not None else None  # noqa: E731
    return {f"{prefix}prompt_scores": listed(scores.prompt_scores) if scores else None,
            f"{prefix}prompt_partials": listed(scores.prompt_partials) if scores else None}  # fmt: skip


def _intervals_json(scores: EvalScores | None, prefix: str) -> dict:
    """`{prefix}score_interval: [lo, hi]`, `{prefix}tasks_interval: {task: [lo, hi]}`, and the partial ones."""
    out: dict = {}
    for part, intervals in (("", scores.intervals if scores else None), ("_partial", scores.intervals_partial if scores else None)):
        out[f"{prefix}score{part}_interval"] = list(intervals.overall) if intervals else None
        out[f"{prefix}tasks{part}_interval"] = {t: list(v) for t, v in intervals.tasks.items()} if intervals else None
    return out
