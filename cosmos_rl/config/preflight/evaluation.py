"""Preflight rules of `[rl.eval]`, evaluation during training (every algorithm; docs/eval.md): its
cadence and sampler, its suite (`rl.eval.suite`) and the reward that scores it."""

from __future__ import annotations

from cosmos_rl.config.preflight.rewards import WEIGHT_FREE_REWARDS, weighted_tables
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.core.problems import show
from cosmos_rl.suites import registry as suites


def eval_rules(c: schema.RunConfig, e: schema.EvalConfig, r: Rules) -> None:
    """[rl.eval] (every algorithm): evaluation during training (docs/eval.md)."""
    r.at_least("rl.eval.every", e.every, 0, "set rl.eval.every to 0 (off) or a number of steps")
    suite = eval_suite(c, e, r)  # also names the suite `cosmos-rl eval RUN_DIR` evaluates
    if e.stop_on_hacking and e.every <= 0:
        r.error("rl.eval.stop_on_hacking", "needs evaluations during training (rl.eval.every is 0), so it would never stop the run",
                e.stop_on_hacking, "set rl.eval.every to a number of steps, or remove rl.eval.stop_on_hacking")
    if e.every <= 0:
        return
    if e.stop_on_hacking and not _train_signal(c):
        r.warn("rl.eval.stop_on_hacking", f"has no effect: {c.rl.algorithm} logs no training reward for the watch to compare",
               e.stop_on_hacking, "remove it")
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
    if e.rewards:  # served as a run's rewards are (evaluation.served); rl.eval.reward then plays no part
        weighted_tables(c, e.rewards, "rl.eval.rewards", r, driver_service=False)
        if e.reward != schema.EvalConfig().reward:
            r.warn("rl.eval.reward", "has no effect with [[rl.eval.rewards]] (the evaluation scores with those)", e.reward, "remove it")
    else:
        eval_reward_rule(c, e, suite, r)
    if e.gold:
        from cosmos_rl.config.run_suite import run_suite

        try:  # the suite the evaluation scores in (the rules above named any problem with it)
            scoring = run_suite(c)
        except suites.UnknownSuite:
            scoring = None
        gold_rule(c, e, scoring, r)
    if e.prompts:
        r.local_path("rl.eval.prompts", e.prompts, kind="file")
        if e.per_task != schema.EvalConfig().per_task:
            r.warn("rl.eval.per_task", "has no effect with rl.eval.prompts (every prompt of the file is used)", e.per_task, "remove it")


def gold_rule(c: schema.RunConfig, e: schema.EvalConfig, suite, r: Rules) -> None:
    """rl.eval.gold: a reward the evaluation can score in-process, other than rl.eval.reward and the training rewards."""
    if suite is None:
        return  # rl.eval.suite or rl.eval.reward is already an error
    names = list(suite.reward_names())
    if c.model.num_frames == 1 and not suite.judges_clips:
        names = [*WEIGHT_FREE_REWARDS, *names]
    if e.gold not in names:
        r.error("rl.eval.gold", "not a reward the evaluation scores in-process", e.gold, f"use one of {', '.join(show(n) for n in names)}, or leave it empty")
        return
    if e.gold == e.reward:
        r.error("rl.eval.gold", "is rl.eval.reward itself, so it adds nothing to the watch", e.gold, "name another reward, or leave it empty")
    rl = c.rl
    trained = {t.name for t in rl.rewards} | ({rl.reward.name} if not rl.rewards else set()) if isinstance(rl, schema.OnlineRLBase) else set()
    if e.gold in trained:
        r.warn("rl.eval.gold", "is a reward the run trains on: the watch would compare the reward with itself", e.gold,
               "name a reward the run does not train on")


def _train_signal(c: schema.RunConfig) -> str:
    from cosmos_rl.config import algorithms

    return algorithms.of(c).train_signal  # the name was looked up when the manifest was read


def eval_suite(c: schema.RunConfig, e: schema.EvalConfig, r: Rules):
    """rl.eval.suite: a known suite judging what the run makes (clips or images); the suite itself, or
    None when it is named wrongly (the reward rules then have no suite to hold to)."""
    if not e.suite:
        return None
    try:
        suite = suites.get(e.suite)
    except suites.UnknownSuite as exc:
        r.error("rl.eval.suite", exc.problem, e.suite, exc.fix)
        return None
    if suite.is_episodic:  # training's evaluation samples captions; an episode suite's windows are `cosmos-rl eval`'s
        r.error("rl.eval.suite", f"{suite.name} is an episode suite (held-out episode windows), which [rl.eval] cannot sample during training",
                e.suite, f"evaluate its checkpoints with `cosmos-rl eval RUN_DIR --suite {suite.name}`, and leave rl.eval.suite empty")  # fmt: skip
        return None
    clips = c.model.num_frames > 1
    if suite.judges_clips != clips:
        makes, judges = ("clips", "images") if clips else ("images", "clips")
        others = [n for n in suites.BUILT_IN if suites.get(n).judges_clips == clips and not suites.get(n).is_episodic]
        r.error("rl.eval.suite", f"judges {judges}, and this run makes {makes} (model.num_frames = {c.model.num_frames})", e.suite,
                f"name a suite of {makes} ({', '.join(others)}), or leave rl.eval.suite empty")  # fmt: skip
        return None
    return suite


def eval_reward_rule(c: schema.RunConfig, e: schema.EvalConfig, suite, r: Rules) -> None:
    """rl.eval.reward: one of the evaluation suite's rewards (its verifier), or for images a weight-free one."""
    try:
        owner = suites.reward_owner(e.reward)
    except suites.UnknownSuite as exc:
        r.error("rl.eval.reward", exc.problem, e.reward, exc.fix)
        return
    if c.model.num_frames > 1:
        if owner is None or not owner.judges_clips:
            clip_suite = suite or suites.for_media(clips=True)
            names = clip_suite.reward_names()
            r.error("rl.eval.reward", f"a video run's evaluation scores clips with the {clip_suite.title} verifier", e.reward,
                    f"set rl.eval.reward = {show(names[0])} (or {show(names[1])})" if len(names) > 1 else f"set rl.eval.reward = {show(names[0])}")  # fmt: skip
            return
    elif (owner is None and e.reward not in WEIGHT_FREE_REWARDS) or (owner is not None and owner.judges_clips):
        names = [*WEIGHT_FREE_REWARDS, *(suite.reward_names() if suite else suites.builtin_reward_names(clips=False))]
        r.error("rl.eval.reward", "not a built-in weight-free reward (evaluation scores in-process)", e.reward,
                f"use one of {', '.join(show(n) for n in names)}")
        return
    if suite is not None and owner is not None and owner.name != suite.name:
        r.error("rl.eval.reward", f"is a reward of the suite {owner.name!r}, and rl.eval.suite names {suite.name!r}", e.reward,
                f"set rl.eval.reward to one of {', '.join(show(n) for n in suite.reward_names())}"
                + ("" if suite.judges_clips else " or a weight-free reward"))  # fmt: skip
