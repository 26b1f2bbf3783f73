"""`cosmos-rl eval TARGET --suite pusht`: a world model scored on an episode suite's held-out windows
x seeds in one mode (`evaluation.world`), beside its base for a run, written as `eval.json` (the keys
of a prompt suite's evaluation, docs/eval.md, with windows in place of prompts, plus `mode`,
`condition`, `windows` and `metrics`) and a side-by-side GIF (truth | prediction | difference).

The mode is `--condition` (forward_dynamics, inverse_dynamics, policy, or first_frame: continuation
from frame 0), else the run's own `[model.condition]`. A bare model's action rows follow the suite's
`ActionSpec` (embodiment and normalisation); a run's its own `[model.action]`. The windows are the
suite's held-out split at the target's frame size, or a LeRobot dataset folder (`--data`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

from cosmos_rl.core.condition import Condition, UnknownCondition, kind_named
from cosmos_rl.core.errors import UserError
from cosmos_rl.suites.base import Suite

SHEET_WINDOWS = 4  # windows shown in the GIF (seed 0), evenly spread over the evaluation's
RESULT_FILE = "eval.json"


def check_closed_loop_flags(closed_loop: bool, *, execute: int | None, max_steps: int | None, base: str | None, data: Path | None) -> None:
    """The closed-loop options only with `--closed-loop`, and `--data` not with it (a dataset's episodes
    hold no simulator state to act from)."""
    if not closed_loop:
        for flag, value in (("--execute", execute), ("--max-steps", max_steps), ("--base", base)):
            if value is not None:
                raise UserError(f"{flag}: an option of a closed-loop evaluation (the model acting in the simulator); add --closed-loop "
                                f"--condition policy --suite pusht, or drop {flag}")  # fmt: skip
    elif data is not None:
        raise UserError("--data: a closed-loop evaluation starts its episodes from the simulator's held-out initial states, and a "
                        "dataset's episodes hold no simulator state to act from; drop --data (or --closed-loop)")  # fmt: skip


def world_condition(kind: str | None, t, suite: Suite) -> Condition:
    """The condition the windows are generated under: `kind` (`--condition`), else a run's own."""
    own = Condition() if t.config is None else Condition.from_model_config(t.config.model).evaluated()
    if kind is None:
        if not own.is_conditioned:
            raise UserError(f"{t.label}: the suite {suite.name} generates its windows in a mode; pass --condition forward_dynamics, "
                            "inverse_dynamics, policy or first_frame")  # fmt: skip
        return own
    try:
        chosen = kind_named(kind)
    except UnknownCondition as exc:
        raise UserError(f"--condition: unknown condition {kind!r}: {exc}") from None
    if not chosen.given_frames:
        raise UserError(f"--condition {kind}: the suite {suite.name} judges a window's generated future from its given frames; "
                        "pass forward_dynamics, inverse_dynamics, policy or first_frame")  # fmt: skip
    if not chosen.action_mode:
        return Condition(kind=chosen, source=suite.name)
    chunk = t.media.frames - 1
    if own.action is not None:  # the run's embodiment and normalisation, in the mode asked for
        spec = dataclasses.replace(own.action, mode=chosen.action_mode, chunk=chunk)
    else:
        spec = suite.actions_of(chosen.action_mode, chunk)
    return Condition(kind=chosen, source=suite.name, action=spec)


def run_world_eval(
    t, suite: Suite, *, condition: str | None, data: Path | None, seeds: int, per_task: int, batch_size: int,
    device: str, note: Callable[[str], None], progress: Callable[[str, int, int], None],
) -> dict:  # fmt: skip
    """Evaluate the opened target `t` (`evaluation.target.open_target`) in the episode suite `suite`;
    the result object, also written to `<out>/eval.json`."""
    from cosmos_rl.commands.eval_json import _intervals_json, _prompt_scores_json, _scores_json
    from cosmos_rl.evaluation.intervals import settings as bootstrap_settings

    if t.media.frames < 2:
        raise UserError(f"suite {suite.name}: judges clips of chunk + 1 frames, and {t.label} makes images; pass --frames 9 (or 4k + 1)")
    if data is not None and not Path(data).is_dir():
        raise UserError(f"--data {str(data)!r}: no such folder; pass a LeRobot dataset folder (holds meta/info.json)")
    given = world_condition(condition, t, suite)
    from cosmos_rl.evaluation.world import dataset_windows, mode_of, write_sheets

    if data is not None:
        from cosmos_rl.data.lerobot import open_dataset

        fps = open_dataset(data).meta.fps
        if t.kind == "model":
            t.media = dataclasses.replace(t.media, fps=fps)  # a bare model samples at the episodes' rate
        elif fps != t.media.fps:
            raise UserError(f"--data {data}: its episodes run at {fps:g} fps, the run at model.fps = {t.media.fps:g}; "
                            "evaluate episodes recorded at the run's rate")  # fmt: skip
        windows = dataset_windows(Path(data), per_task, t.media)
        described = f"--data {data}: {len(windows)} windows of {t.media.frames} frames (one per episode)"
    else:
        if t.kind == "model":
            t.media = dataclasses.replace(t.media, fps=suite.media.fps)  # the world's own rate (its action caption names it)
        windows = suite.windows(per_task, t.media)
        described = f"{suite.held_out_title}: {len(windows)} windows of {t.media.frames} frames (one per episode)"
    mode = mode_of(given)

    from cosmos_rl.core.media import latent_shape
    from cosmos_rl.dist.world import pick_device
    from cosmos_rl.evaluation.world import WorldEvaluator
    from cosmos_rl.suites.base import spread

    where = pick_device(device)
    model = t.load(where, heads=given.action is not None)
    transformer_config = model.parts.transformer.config
    if given.action is not None:
        from cosmos_rl.models.actions import ActionLayout

        try:
            ActionLayout.of(given.action, 1).check(transformer_config)
        except ValueError as exc:
            raise UserError(f"{t.label}: {exc}; evaluate a Cosmos3 model built with action heads (action_gen = true)") from None
    evaluator = WorldEvaluator(
        windows, seeds, suite, given, t.settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae, media=t.media,
        latent_shape=latent_shape(t.media, model.parts.vae.config, transformer_config), device=where,
        model_parts=model.model_parts, batch_size=batch_size, origin=described.split(":")[0],
    )  # fmt: skip
    shown = spread(list(range(len(windows))), SHEET_WINDOWS)
    kept = [window * seeds for window in shown]  # item index of each shown window's seed 0

    def run(network, label: str):
        evaluator.on_batch = lambda done, total: progress(label, done, total)
        clips, actions = evaluator.sample(network, evaluator.items)
        verdicts = evaluator.judge(evaluator.items, clips, actions)
        return evaluator.scores(verdicts), [clips[i] for i in kept], [verdicts[i] for i in kept]

    sampled = f"checkpoint step {t.step}" if model.base is not None else "model"
    with model.policy() as network:
        scores, policy_clips, policy_verdicts = run(network, sampled)
    base = diff = None
    sheet_models = [("model" if model.base is None else "checkpoint", policy_clips, policy_verdicts)]
    if model.base is not None:
        from cosmos_rl.evaluation.scores import difference

        with model.base() as network:
            base, base_clips, base_verdicts = run(network, "base")
        diff = difference(scores.main, base.main)  # identical noise per item: a paired comparison
        sheet_models.insert(0, ("base", base_clips, base_verdicts))
    png, gif = write_sheets(t.out_dir / "windows.png", [windows[w] for w in shown], [windows[w].frames for w in shown], sheet_models, mode)

    def metric_json(name: str) -> dict:
        from cosmos_rl.evaluation.scores import difference as paired

        m, b = scores.metrics[name], base.metrics[name] if base else None
        d = paired(m, b) if b is not None else None
        return {"value": m.score, "interval": list(m.intervals.overall), "tasks": m.tasks,
                "base": b.score if b else None, "base_interval": list(b.intervals.overall) if b else None,
                "diff": d.score if d else None, "diff_interval": list(d.intervals.overall) if d else None}  # fmt: skip

    main, base_main = scores.main, base.main if base else None
    result = {
        "target": t.label, "kind": t.kind, "step": t.step, "reward": main.reward,
        **_scores_json(main, ""), **_scores_json(base_main, "base_"),
        "n_prompts": len(windows), "seeds": list(range(seeds)), "n_images": len(evaluator.items),
        "prompts": described, "sampler": t.settings.resolved(model.model_parts).as_json(), "image_size": t.media.size_json(),
        "grid": str(png), "grid_prompts": [windows[w].label for w in shown],
        **_intervals_json(main, ""), **_intervals_json(base_main, "base_"),
        **_scores_json(diff, "diff_"), **_intervals_json(diff, "diff_"), "bootstrap": bootstrap_settings(),
        "grid_gif": str(gif), "frames": t.media.frames, "fps": t.media.fps, "i2v": True,
        **_prompt_scores_json(main, ""), **_prompt_scores_json(base_main, "base_"),
        "suite": suite.name,
        # An episode suite's own: the mode, what each sample was given, the windows, the verdicts' further numbers.
        "mode": mode, "condition": given.describe(), "given_frames": evaluator.given,
        "action": dataclasses.asdict(given.action) if given.action is not None else None,
        "windows": [{"task": w.task, "episode": w.episode.index, "start": w.start, "frames": w.chunk + 1} for w in windows],
        "metrics": {name: metric_json(name) for name in scores.metrics},
    }  # fmt: skip
    (t.out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    note(f"{len(evaluator.items)} windows x seeds sampled per model ({mode}); no verdict cache for episode suites")
    return result


# ------------------------------------------------------------------------------- closed loop
HELD_OUT_STARTS = 50  # initial states in the whole closed-loop split (--per-task 0); Diffusion Policy's Push-T evaluation also runs 50
DEFAULT_MAX_STEPS = 300  # gym-pusht's own episode limit (max_episode_steps)
CLOSED_LOOP_GIF = "episodes.gif"
CLOSED_LOOP_SHOWN = 4  # episodes shown in the GIF (seed 0), evenly spread over the states


def closed_loop_options(t, *, execute: int | None, max_steps: int | None) -> tuple[int, int]:
    """(execute, max_steps) for target `t`'s chunk: the defaults (half the chunk, as Diffusion Policy
    executes 8 of 16; gym-pusht's 300 steps) or the flags, checked."""
    chunk = t.media.frames - 1
    if chunk < 1:
        raise UserError(f"--closed-loop: the model acts in chunks of frames - 1 actions, and {t.label} makes images; pass --frames 9 (or 4k + 1)")
    execute = max(1, chunk // 2) if execute is None else execute
    if not 1 <= execute <= chunk:
        raise UserError(f"--execute {execute}: must be in [1, {chunk}] (the actions of a chunk: {t.media.frames} frames make {chunk}); "
                        f"pass e.g. --execute {max(1, chunk // 2)}")  # fmt: skip
    max_steps = DEFAULT_MAX_STEPS if max_steps is None else max_steps
    if max_steps < 1:
        raise UserError(f"--max-steps {max_steps}: an episode's step budget must be at least 1; pass e.g. --max-steps {DEFAULT_MAX_STEPS}")
    return execute, max_steps


def run_closed_loop_eval(
    t, suite: Suite, *, condition: str | None, base: str | None, execute: int | None, max_steps: int | None, seeds: int,
    per_task: int, batch_size: int, device: str, note: Callable[[str], None], progress: Callable[[str, int, int], None],
) -> dict:  # fmt: skip
    """`cosmos-rl eval TARGET --suite pusht --condition policy --closed-loop`: the opened target `t`
    acts in the Push-T simulator from the held-out initial states x seeds (`evaluation.closed_loop`),
    beside a base (`base`: another run or model folder; else a run's own base); the result object,
    also written to `<out>/eval.json`, and the episode GIF."""
    from cosmos_rl.commands.eval_json import _intervals_json, _prompt_scores_json, _scores_json
    from cosmos_rl.evaluation.intervals import settings as bootstrap_settings

    if suite.name != "pusht":
        raise UserError(f"--closed-loop: steps the Push-T simulator, and the suite is {suite.name}; pass --suite pusht")
    given = world_condition(condition, t, suite)
    if given.action is None or given.action.mode != "policy":
        what = f"--condition {condition}" if condition else f"{t.label}'s [model.condition] ({given.describe()})"
        raise UserError(f"{what}: --closed-loop acts with the actions the model generates from the current frame; pass --condition policy")
    execute, max_steps = closed_loop_options(t, execute=execute, max_steps=max_steps)
    if t.kind == "model":
        t.media = dataclasses.replace(t.media, fps=suite.media.fps)  # the world's own rate (its action caption names it)
    other = None
    if base is not None:
        from cosmos_rl.evaluation.target import open_target

        # A model folder samples at the target's size; a run at its own (checked next, named by --base).
        other = open_target(base, media=None if (Path(base) / "manifest.toml").is_file() else t.media, out_dir=t.out_dir)
        if other.media.size != t.media.size or other.media.frames != t.media.frames:
            raise UserError(f"--base {base}: samples {other.media.frames} frames of {other.media.height}x{other.media.width}, "
                            f"{t.label} {t.media.frames} of {t.media.height}x{t.media.width}; compare models that act at one size and chunk")  # fmt: skip

    from cosmos_rl.core.media import latent_shape
    from cosmos_rl.dist.world import pick_device
    from cosmos_rl.evaluation.closed_loop import ClosedLoopEvaluator, episode_json, write_episode_gif
    from cosmos_rl.evaluation.world import WorldSampler
    from cosmos_rl.models.actions import ActionLayout
    from cosmos_rl.pusht.closed_loop import held_out_starts
    from cosmos_rl.pusht.episodes import TASK
    from cosmos_rl.suites.base import spread

    where = pick_device(device)
    starts = held_out_starts(HELD_OUT_STARTS if per_task <= 0 else min(per_task, HELD_OUT_STARTS))

    def load(target):
        model = target.load(where, heads=True)
        try:
            ActionLayout.of(given.action, 1).check(model.parts.transformer.config)
        except ValueError as exc:
            raise UserError(f"{target.label}: {exc}; evaluate a Cosmos3 model built with action heads (action_gen = true)") from None
        return model

    def act(model, network, label: str):
        """(evaluator, scores, episodes) of `network` (a context manager) acting from every item."""
        config = model.parts.transformer.config
        sampler = WorldSampler(given, t.settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae, media=t.media,
                               latent_shape=latent_shape(t.media, model.parts.vae.config, config), device=where,
                               model_parts=model.model_parts, batch_size=batch_size)  # fmt: skip
        evaluator = ClosedLoopEvaluator(sampler, starts, seeds, TASK, execute=execute, max_steps=max_steps)
        evaluator.on_chunk = lambda index, running: progress(f"{label} chunk {index}", len(evaluator.items) - running, len(evaluator.items))
        with network() as transformer:
            episodes = evaluator.run(transformer)
        return evaluator, evaluator.scores(episodes), episodes

    model = load(t)
    evaluator, scores, episodes = act(model, model.policy, f"checkpoint step {t.step}" if t.kind == "run" else "model")
    base_scores = base_episodes = None
    if other is not None:
        other_model = load(other)
        _, base_scores, base_episodes = act(other_model, other_model.policy, "base")
    elif model.base is not None:  # a run's own base: the same network, adapters off (evaluation.target)
        _, base_scores, base_episodes = act(model, model.base, "base")
    from cosmos_rl.evaluation.scores import difference

    diff = difference(scores.main, base_scores.main) if base_scores is not None else None  # identical noise per chunk: paired
    shown = spread(list(range(len(starts))), CLOSED_LOOP_SHOWN)
    kept = [state * seeds for state in shown]  # each shown state's seed 0
    models = [("checkpoint" if t.kind == "run" else "model", [episodes[i] for i in kept])]
    if base_episodes is not None:
        models.insert(0, ("base", [base_episodes[i] for i in kept]))
    gif = write_episode_gif(t.out_dir / CLOSED_LOOP_GIF, [f"start {state}, seed 0" for state in shown], models)

    def metric_json(name: str) -> dict:
        m, b = scores.metrics[name], base_scores.metrics[name] if base_scores else None
        d = difference(m, b) if b is not None else None
        return {"value": m.score, "interval": list(m.intervals.overall), "base": b.score if b else None,
                "base_interval": list(b.intervals.overall) if b else None, "diff": d.score if d else None,
                "diff_interval": list(d.intervals.overall) if d else None}  # fmt: skip

    main, base_main = scores.main, base_scores.main if base_scores else None
    base_label = base if base is not None else (f"{t.label} (its base)" if base_scores is not None else None)
    result = {
        "target": t.label, "kind": t.kind, "step": t.step, "reward": main.reward, "base_target": base_label,
        **_scores_json(main, ""), **_scores_json(base_main, "base_"),
        "n_prompts": len(starts), "seeds": list(range(seeds)), "n_images": len(evaluator.items),
        "prompts": f"Push-T held-out initial states: {len(starts)} (the env's start distribution, held-out seed stream)",
        "sampler": t.settings.resolved(model.model_parts).as_json(), "image_size": t.media.size_json(),
        **_intervals_json(main, ""), **_intervals_json(base_main, "base_"),
        **_scores_json(diff, "diff_"), **_intervals_json(diff, "diff_"), "bootstrap": bootstrap_settings(),
        "grid": str(gif), "grid_gif": str(gif), "frames": t.media.frames, "fps": t.media.fps,
        **_prompt_scores_json(main, ""), **_prompt_scores_json(base_main, "base_"),
        "suite": suite.name, "mode": "policy", "condition": given.describe(), "action": dataclasses.asdict(given.action),
        # The closed loop's own: the headline numbers by name, the loop's settings, every episode.
        "closed_loop": True, "success_rate": main.score, "max_coverage": main.score_partial,
        "execute": execute, "max_steps": max_steps, "chunk": given.action.chunk,
        "starts": starts.tolist(), "metrics": {name: metric_json(name) for name in scores.metrics},
        "episodes": [episode_json(item, episode) for item, episode in zip(evaluator.items, episodes)],
        "base_episodes": [episode_json(item, episode) for item, episode in zip(evaluator.items, base_episodes)] if base_episodes else None,
    }  # fmt: skip
    (t.out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    note(f"{len(evaluator.items)} episodes (initial states x seeds) per model, {execute} of every {given.action.chunk} actions executed, "
         f"at most {max_steps} steps")  # fmt: skip
    return result
