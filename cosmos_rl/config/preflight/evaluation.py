"""Preflight rules of `[rl.eval]`, evaluation during training (every algorithm; docs/eval.md)."""

from __future__ import annotations

from cosmos_rl.config.preflight.rewards import BUILTIN_REWARDS, VIDEO_REWARDS
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.core.problems import show


def eval_rules(c: schema.RunConfig, e: schema.EvalConfig, r: Rules) -> None:
    """[rl.eval] (every algorithm): evaluation during training (docs/eval.md)."""
    r.at_least("rl.eval.every", e.every, 0, "set rl.eval.every to 0 (off) or a number of steps")
    if e.every <= 0:
        return
    if c.job.log_every >= 1 and e.every % c.job.log_every:
        r.error("rl.eval.every", f"must be a multiple of job.log_every ({c.job.log_every}), or its eval/ rows are never written", e.every,
                f"use a multiple of {c.job.log_every}")
    if e.every > c.rl.max_steps >= 1:
        r.warn("rl.eval.every", f"is more than rl.max_steps ({c.rl.max_steps}), so the run never evaluates", e.every, "lower it, or set it to 0")
    r.at_least("rl.eval.seeds", e.seeds, 1)
    r.at_least("rl.eval.per_task", e.per_task, 0, "set rl.eval.per_task to 0 (every held-out prompt) or more")
    r.at_least("rl.eval.hacking_window", e.hacking_window, 2, "set rl.eval.hacking_window to 2 or more (evaluations compared oldest to newest)")
    r.at_least("rl.eval.sample_steps", e.sample_steps, 0, "set rl.eval.sample_steps to 0 (the run's own) or a number of sampler steps")
    if e.guidance is not None:
        r.at_least("rl.eval.guidance", e.guidance, 0, "set rl.eval.guidance to 1 (conditional only) or more, or remove it")
    if c.model.num_frames > 1:
        if e.reward not in VIDEO_REWARDS:
            r.error("rl.eval.reward", "a video run's evaluation scores clips with the moving-shapes verifier", e.reward,
                    f"set rl.eval.reward = {show(VIDEO_REWARDS[0])} (or {show(VIDEO_REWARDS[1])})")
    elif e.reward not in BUILTIN_REWARDS:
        r.error("rl.eval.reward", "not a built-in weight-free reward (evaluation scores in-process)", e.reward,
                f"use one of {', '.join(show(n) for n in BUILTIN_REWARDS)}")
    if e.prompts:
        r.local_path("rl.eval.prompts", e.prompts, kind="file")
        if e.per_task != schema.EvalConfig().per_task:
            r.warn("rl.eval.per_task", "has no effect with rl.eval.prompts (every prompt of the file is used)", e.per_task, "remove it")
