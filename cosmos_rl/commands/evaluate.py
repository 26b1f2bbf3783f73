"""`cosmos-rl eval TARGET`: score a run's newest checkpoint against its base (or a bare model) on a
suite's held-out prompts x fixed seeds, print the scores, write the sample grid and `eval.json`.

The suite (`cosmos_rl.suites`) is `--suite`, else the one that registers `--reward`, else the run's
(`config.run_suite`), else the one whose base a `preset:NAME` is; a model folder names none, so it
needs one of the two flags. The result object (printed by `--json`, written to `<out>/eval.json`)
is documented in docs/eval.md; `score` is the headline (strict with the suite's verifier).
Any reward a run trains on scores too (`--reward KIND=FOLDER`, `--reward-url`, several weighted,
or a run's `[[rl.eval.rewards]]`): through reward services, as `evaluation.served` says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence

from cosmos_rl.core.condition import BUILT_IN as BUILT_IN_KINDS, Condition, UnknownCondition, kind_named
from cosmos_rl.commands.eval_json import _intervals_json, _prompt_scores_json, _scores_json
from cosmos_rl.core.errors import UserError
from cosmos_rl.evaluation.prompts import DEFAULT_PER_TASK, DEFAULT_SEEDS, eval_captions, overlap, spread
from cosmos_rl.evaluation.intervals import cell, settings as bootstrap_settings
from cosmos_rl.evaluation.scores import caption_groups, difference, reward_names
from cosmos_rl.config.run_suite import run_suite
from cosmos_rl.config.sampler import DEFAULT_BATCH
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import Suite
GRID_COLUMNS = 8  # prompts shown in the grid (seed 0), evenly spread over the evaluation's prompts
RESULT_FILE = "eval.json"

# Caps on the counts an option sets, so a typo (10**30) is refused at once instead of allocating
# prompts x seeds items or a 100000-pixel canvas until memory runs out. Each is far past any honest
# use; the messages say why.
SEEDS_MAX = 1000  # 1000 seeds x the 319 held-out prompts is 319,000 images; intervals are over prompts
IMAGE_SIZE_MAX = 4096  # one 4096 x 4096 sample is 16.8 M pixels; Cosmos3 models are trained at 256 to 1024
SAMPLE_STEPS_MAX = 1000  # the flow sampler converges in tens of steps (rollouts use 10 to 50)
FRAMES_MAX = 257  # 4k + 1: Cosmos3 clips are 93 to 121 frames; every latent frame adds a full frame's tokens


def check_options(seeds: int, per_task: int, reward: str | None, batch_size: int, suite: Suite | None = None) -> None:
    """The counts, and the reward unless it is None (not known yet: it follows the target's suite)."""
    if seeds < 1:
        raise UserError(f"--seeds: must be >= 1 (got {seeds}); seeds 0 .. N-1 are used on every call")
    if seeds > SEEDS_MAX:
        raise UserError(f"--seeds: at most {SEEDS_MAX} (got {seeds}): every seed samples every prompt once more, and the "
                        f"intervals are over prompts, so more seeds only cost time; use e.g. 2, or more prompts")
    if per_task < 0:
        raise UserError(f"--per-task: must be >= 0 (got {per_task}); 0 takes every held-out prompt")
    if reward is None:
        if batch_size < 1:
            raise UserError(f"--batch-size: must be >= 1 (got {batch_size})")
        return
    check_sampling_options(reward, batch_size, suite)


def check_sampling_options(reward: str, batch_size: int, suite: Suite) -> None:
    """The options every command that samples and scores with a built-in reward shares (eval, pairs
    mine): the reward is one `suite` evaluates with (its own, or a weight-free one for images)."""
    if batch_size < 1:
        raise UserError(f"--batch-size: must be >= 1 (got {batch_size})")
    if reward not in reward_names(suite):
        what = "clip reward (the target makes video)" if suite.judges_clips else "weight-free reward"
        raise UserError(f"--reward: {reward!r} is not a built-in {what} of the suite {suite.name}; use one of {', '.join(reward_names(suite))}, "
                        "a model reward's folder (pickscore=FOLDER, clipscore=FOLDER, aesthetic=FOLDER, hps=FOLDER, videoalign=FOLDER) or --reward-url URL for a service's")  # fmt: skip


def named_suite(suite: str | None, reward: str | None) -> Suite | None:
    """The suite `--suite` names, else the one that registers `--reward`; None when neither names one."""
    try:
        named = suites.get(suite) if suite else None
    except suites.UnknownSuite as exc:
        raise UserError(f"--suite {suite!r}: {exc}") from None
    try:
        owner = suites.reward_owner(reward) if reward else None
    except suites.UnknownSuite as exc:
        raise UserError(f"--reward {reward!r}: {exc}") from None
    if named is not None and named.is_episodic and reward:
        raise UserError(f"--reward {reward}: the suite {named.name} scores held-out episode windows with its verifier per mode "
                        "(--condition); drop --reward")  # fmt: skip
    if named is not None and owner is not None and owner.name != named.name:
        raise UserError(f"--reward {reward}: a reward of the suite {owner.name}, and --suite names {named.name}; "
                        f"use one of {', '.join(reward_names(named))}, or drop --suite")  # fmt: skip
    return named or owner


def target_suite(t, named: Suite | None) -> Suite:
    """The suite an evaluation of target `t` scores in: the one named (`named_suite`), else a run's
    own (`config.run_suite`), else a preset's (`suites.registry.of_preset`); a UserError for a model
    that names none, or a suite that judges other media than the target makes."""
    from cosmos_rl.evaluation.target import PRESET

    suite = named
    if suite is None and t.kind == "run":
        try:
            suite = run_suite(t.config)
        except suites.UnknownSuite as exc:
            raise UserError(f"{t.label}: its manifest's rl.eval.suite or reward: {exc}; pass --suite") from None
    if suite is None and t.label.startswith(PRESET):
        suite = suites.of_preset(t.label[len(PRESET):])
    if suite is None:
        raise UserError(f"TARGET {t.label!r}: a model that names no suite to evaluate in; pass --suite NAME (one of {suites.known()}) "
                        "or --reward naming a suite's reward")  # fmt: skip
    if suite.judges_clips != t.media.is_video:
        makes = f"{t.media.frames}-frame clips" if t.media.is_video else "images (1 frame)"
        judges = f"clips ({suite.media.frames} frames)" if suite.judges_clips else "images"
        fix = f"--frames {suite.media.frames}" if suite.judges_clips else "--frames 1"
        raise UserError(f"suite {suite.name}: judges {judges}, and {t.label} makes {makes}; "
                        f"evaluate it in a suite of what it makes, or pass {fix} for a bare model")  # fmt: skip
    return suite


def check_frames(frames: int | None) -> None:
    """A bare model's `--frames` (eval, pairs mine): 4k + 1, at most FRAMES_MAX; None keeps the target's own."""
    from cosmos_rl.core.media import is_wan_frame_count

    if frames is not None and not is_wan_frame_count(frames):
        raise UserError(f"--frames: a clip has 4k + 1 frames (the Wan VAE's), or 1 for images (got {frames})")
    if frames is not None and frames > FRAMES_MAX:
        raise UserError(f"--frames: at most {FRAMES_MAX} (got {frames}): Cosmos3 clips are 93 to 121 frames, and every "
                        "latent frame adds a whole frame's tokens to each sample; use e.g. 9 or 121")


def check_out_dir(out_dir: Path | None) -> None:
    """An --out that exists must be a folder (a file there, /etc/passwd say, is refused before anything runs)."""
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise UserError(f"--out {str(out_dir)!r}: is a file, not a folder; pass a folder (new or existing) to write to")


def check_prompts_file(prompts: Path | None) -> None:
    """A --prompts file must exist (said before its suffix is judged: a missing `prompts` is not a
    naming problem)."""
    if prompts is not None and not Path(prompts).is_file():
        what = "is a folder" if Path(prompts).is_dir() else "file not found"
        raise UserError(f"--prompts {str(prompts)!r}: {what}; pass a prompt file (.txt, one prompt a line, or .jsonl)")


def check_sampler_overrides(sample_steps: int | None, guidance: float | None) -> None:
    if sample_steps is not None and sample_steps < 1:
        raise UserError(f"--sample-steps: must be >= 1 (got {sample_steps})")
    if sample_steps is not None and sample_steps > SAMPLE_STEPS_MAX:
        raise UserError(f"--sample-steps: at most {SAMPLE_STEPS_MAX} (got {sample_steps}): the flow sampler "
                        "converges in tens of steps (the rollouts use 10 to 50); use e.g. 20")
    if guidance is not None and not (math.isfinite(guidance) and guidance >= 0):
        raise UserError(f"--guidance: must be >= 0 and finite (got {guidance}); 1 is conditional only")


def eval_condition(kind: str | None, t, target: str) -> Condition:
    """The condition an evaluation samples under: `kind` (`--condition`) or, None, the run's own
    `[model.condition]` when every sample of it was conditioned (a share, SFT's, and a bare model:
    none). The given frames are the evaluation world's ground truth whatever source the run trained from."""
    if kind is None:
        return Condition() if t.config is None else Condition.from_model_config(t.config.model).evaluated()
    try:
        chosen = kind_named(kind)
    except UnknownCondition as exc:
        raise UserError(f"--condition: unknown condition {kind!r}: {exc}") from None
    if not chosen.given_frames:
        return Condition()
    if not t.media.is_video:
        raise UserError(f"--condition {kind}: {target} makes images ({t.media.frames} frame); a condition gives a clip's "
                        "leading frames, so it needs a video target (--frames 9 for a bare model)")
    return Condition(kind=chosen, source="suite")


def run_eval(
    target: str, *, prompts: Path | None = None, seeds: int = DEFAULT_SEEDS, per_task: int = DEFAULT_PER_TASK,
    reward: str | None = None, batch_size: int = DEFAULT_BATCH, image_size: int | None = None,
    out_dir: Path | None = None, device: str = "auto", warn: Callable[[str], None] = lambda line: None,
    sample_steps: int | None = None, guidance: float | None = None, step: int | None = None,
    frames: int | None = None, condition: str | None = None, note: Callable[[str], None] = lambda line: None,
    progress: Callable[[str, int, int], None] = lambda what, done, total: None,
    suite: str | None = None, data: Path | None = None, reward_url: str | None = None,
    reward_weights: Sequence[str] = (), reward_token_env: str | None = None, closed_loop: bool = False,
    execute: int | None = None, max_steps: int | None = None, base: str | None = None,
) -> dict:  # fmt: skip
    """Evaluate `target` and return the result object (see docs/eval.md); `warn` gets warning lines,
    `note` the line of images sampled and reused (the base's, or a bare model's, verdicts are kept
    in `evaluation.verdict_cache`).

    `sample_steps` / `guidance` replace the target's own sampler settings (to compare models of
    different runs under one sampler); None keeps them. `suite` names the suite (module docstring);
    `reward` None is its verifier's strict score (its first reward); `frames` a bare model's clip
    length; `condition` a condition kind (`first_frame`: every clip given the suite's first frame of
    its caption), None = the run's own `[model.condition]` when every sample of it is conditioned
    (a bare model: none). `progress(what, done, total)` follows the sampling: `what` the model
    sampled ("checkpoint step N", "base", "model"), after every sampler call. An episode suite
    (`pusht`) is evaluated on its held-out windows (or the LeRobot dataset `data`) in the condition's
    mode by `commands.world_eval`; `closed_loop` (with `--condition policy`) makes the model act in
    its simulator instead (`execute` of every chunk's actions stepped, `max_steps` a budget per
    episode), compared with `base` (a run or model) when given, else a run's own base.

    `reward` may also be a list of `--reward` items; with a model reward's folder (`pickscore=FOLDER`),
    `reward_url`, `reward_weights` (`NAME=W`) or several items the images are scored through reward
    services as a run's are (`evaluation.served`): the weighted sum, one score per image, no partial."""
    from cosmos_rl.evaluation.served import ServedRewards, label, manifest_terms, served_terms

    items = [reward] if isinstance(reward, str) else list(reward or [])
    terms = served_terms(items, reward_url, reward_weights, reward_token_env)
    reward = None if terms is not None else (items[0] if items else None)
    if image_size is not None and not 1 <= image_size <= IMAGE_SIZE_MAX:
        raise UserError(f"--image-size: must be in [1, {IMAGE_SIZE_MAX}] (got {image_size}): one {IMAGE_SIZE_MAX} x {IMAGE_SIZE_MAX} "
                        "sample is 16.8 M pixels, and Cosmos3 models are trained at 256 to 1024; use e.g. 32 or 512")
    check_frames(frames)
    check_options(seeds, per_task, None, batch_size)
    check_sampler_overrides(sample_steps, guidance)
    check_out_dir(out_dir)
    check_prompts_file(prompts)
    named = named_suite(suite, reward)
    from cosmos_rl.commands.world_eval import check_closed_loop_flags

    check_closed_loop_flags(closed_loop, execute=execute, max_steps=max_steps, base=base, data=data)
    from cosmos_rl.evaluation.target import open_target, target_media

    media = target_media(target, image_size, frames)
    t = open_target(target, step=step, media=media, out_dir=out_dir, frames=frames)  # refuses before anything loads
    if t.kind == "model" and media is None and named is not None:
        t.media = named.media  # a model folder given no size samples what the suite judges
    chosen = target_suite(t, named)
    if chosen.is_episodic:
        if reward is not None or prompts is not None or terms is not None:
            flag = "--reward" if reward is not None or terms is not None else "--prompts"
            raise UserError(f"{flag}: the suite {chosen.name} scores held-out episode windows with its verifier per mode; drop {flag} "
                            "(--data names a LeRobot dataset of episodes instead)")  # fmt: skip
        from cosmos_rl.commands.world_eval import run_world_eval

        t.settings = t.settings.replaced(sample_steps, guidance)
        if closed_loop:
            from cosmos_rl.commands.world_eval import run_closed_loop_eval

            return run_closed_loop_eval(t, chosen, condition=condition, base=base, execute=execute, max_steps=max_steps, seeds=seeds,
                                        per_task=per_task, batch_size=batch_size, device=device, note=note, progress=progress)  # fmt: skip
        return run_world_eval(t, chosen, condition=condition, data=data, seeds=seeds, per_task=per_task, batch_size=batch_size,
                              device=device, note=note, progress=progress)  # fmt: skip
    if closed_loop:
        raise UserError(f"--closed-loop: the model acts in an episode suite's simulator, and the suite {chosen.name} scores prompts; "
                        "pass --suite pusht --condition policy")  # fmt: skip
    if data is not None:
        raise UserError(f"--data: a LeRobot dataset of held-out episodes is for an episode suite (pusht); the suite {chosen.name} "
                        "scores prompts: drop --data, or pass --suite pusht")  # fmt: skip
    wants_actions = bool(kind_named(condition).action_mode) if condition in BUILT_IN_KINDS else (
        condition is None and t.config is not None and Condition.from_model_config(t.config.model).has_actions)
    if wants_actions:
        what = f"--condition {condition}" if condition else f"{t.label}'s [model.condition]"
        raise UserError(f"{what}: an action mode generates episode windows, and the suite {chosen.name} scores prompts; "
                        "pass --suite pusht (or another episode suite)")  # fmt: skip
    video = t.media.is_video
    from_manifest = terms is None and reward is None and t.config is not None and bool(t.config.rl.eval.rewards)
    if from_manifest:  # a run that evaluates with [[rl.eval.rewards]] is scored with them unless --reward says otherwise
        terms = manifest_terms(t.config)
    if terms is None:
        reward = chosen.default_reward if reward is None else reward
        check_sampling_options(reward, batch_size, chosen)
    else:
        reward = label(terms)
    given = eval_condition(condition, t, target)
    if given.is_conditioned and not chosen.gives_frames:
        raise UserError(f"--condition: the suite {chosen.name} gives no first frames to condition clips on; use --condition none")
    captions, described = eval_captions(prompts, per_task, chosen)
    origin = f"--prompts {prompts}" if prompts else "the held-out prompts"
    caption_groups(captions, reward, origin, chosen)  # a bad prompt fails before torch is even imported
    from cosmos_rl.dist.world import pick_device

    where = pick_device(device)
    # A served reward is started and checked (its folder loaded, its service's /info read) before the target loads.
    served = None if terms is None else ServedRewards(terms, t.media, manifest=from_manifest)
    try:
        model = t.load(where)
        t.settings = t.settings.replaced(sample_steps, guidance)
        train_prompts = t.train_prompts()
        if train_prompts is not None:
            seen = overlap(train_prompts, captions, chosen)
            if seen:
                warn(f"{len(seen)} of the {len(captions)} evaluation prompts are training prompts of the run (e.g. {seen[0]!r}): "
                     "their scores measure memory, not generalisation")  # fmt: skip
        return _evaluate(t, model, captions, described, seeds, reward, batch_size, where, origin, given, chosen, served,
                         warn=warn, note=note, progress=progress)  # fmt: skip
    finally:
        if served is not None:
            served.close()


def _evaluate(t, model, captions, described, seeds, reward, batch_size, where, origin, given, chosen, served, *, warn, note, progress) -> dict:
    """Sample and score the target (and its base), write the grid and eval.json (`run_eval`)."""
    from cosmos_rl.core.media import latent_shape
    from cosmos_rl.evaluation.evaluator import Evaluator

    video = t.media.is_video
    evaluator = Evaluator(
        captions, seeds, reward, t.settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae, media=t.media,
        latent_shape=latent_shape(t.media, model.parts.vae.config, model.parts.transformer.config), device=where, batch_size=batch_size, origin=origin,
        model_parts=model.model_parts, condition=given, suite=chosen, scorer=served,
    )  # fmt: skip
    columns = [item.index for item in spread(evaluator.items[: len(captions)], GRID_COLUMNS)]
    keep = frozenset(columns)
    from cosmos_rl.evaluation.verdict_cache import VerdictCache, folder_for

    cache = VerdictCache(*folder_for(t), warn)  # a checkpoint is sampled every time; its base (or a bare model) once
    sampled = f"checkpoint step {t.step}" if model.base is not None else "model"
    evaluator.on_batch = lambda done, total: progress(sampled, done, total)
    with model.policy() as network:
        policy_done = evaluator.scored(network, keep=keep) if model.base is not None else cache.scored(evaluator, network, keep)
    scores = evaluator.scores(policy_done.totals, policy_done.prompts)
    # each served reward's named dimensions, per model scored (None when none has any, or every score came from the cache)
    dimensions = {"": served.take_dimensions() if served is not None else None, "base_": None}
    base, diff, rows = None, None, [("model", policy_done.kept)]
    if model.base is not None:
        evaluator.on_batch = lambda done, total: progress("base", done, total)
        with model.base() as network:
            base_done = cache.scored(evaluator, network, keep)
        base = evaluator.scores(base_done.totals, base_done.prompts)
        dimensions["base_"] = served.take_dimensions() if served is not None else None
        diff = difference(scores, base)  # identical noise per item: a paired comparison
        rows = [("base", base_done.kept), (f"checkpoint\nstep {t.step}", policy_done.kept)]
    grid = write_grid(t.out_dir / ("before_after.png" if base is not None else "samples.png"),
                      [(label, [kept[i] for i in columns]) for label, kept in rows],
                      [evaluator.items[i].caption for i in columns], reward)  # fmt: skip
    clip_extra = {}
    if video:  # the PNG is the frame strips; the GIF plays the same clips side by side
        clip_extra = {"grid_gif": str(grid.with_suffix(".gif")), "frames": t.media.frames, "fps": t.media.fps, "i2v": given.is_conditioned}
    result = {
        "target": t.label, "kind": t.kind, "step": t.step, "reward": reward,
        **_scores_json(scores, ""), **(_scores_json(base, "base_") if base else _scores_json(None, "base_")),
        "n_prompts": len(captions), "seeds": list(range(seeds)), "n_images": len(evaluator.items),
        "prompts": described, "sampler": t.settings.resolved(model.model_parts).as_json(), "image_size": t.media.size_json(),
        "grid": str(grid), "grid_prompts": [evaluator.items[i].caption for i in columns],
        # Added with the intervals, after every older key (docs/eval.md, "How sure a score is").
        **_intervals_json(scores, ""), **_intervals_json(base, "base_"),
        **_scores_json(diff, "diff_"), **_intervals_json(diff, "diff_"), "bootstrap": bootstrap_settings(),
        **clip_extra,
        # Added after the intervals: what `cosmos-rl compare` pairs two runs' checkpoints on.
        **_prompt_scores_json(scores, ""), **_prompt_scores_json(base, "base_"),
        "suite": chosen.name,  # added with suites: the world whose prompts and verifier made these numbers
        # Added with served rewards: each reward scored through a service (folder or url), its weight and revision; null = in-process.
        "rewards": served.describe() if served is not None else None,
        # Added with rewards of named dimensions (VideoAlign's vq, mq, ta): each one's mean over the samples scored.
        "reward_dimensions": dimensions[""], "base_reward_dimensions": dimensions["base_"],
    }  # fmt: skip
    # allow_nan=False: `Infinity` is not JSON; every number here is finite by the checks above.
    (t.out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    note(cache.summary(len(evaluator.items) if model.base is not None else 0))
    return result


def write_grid(path: Path, rows: list[tuple[str, list]], captions: list[str], reward: str) -> Path:
    """One labelled row per model (base above the checkpoint), one column per kept item: its image
    upscaled, its caption and its verdict (`evaluation.grid`)."""
    from cosmos_rl.evaluation.grid import Tile, save_sheet, verdict_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path.parent}: cannot create the evaluation folder ({exc.strerror}); pass a writable --out") from None
    sheet_rows = []
    for label, samples in rows:
        tiles = []
        for sample, caption in zip(samples, captions, strict=True):
            text, passed = verdict_text(reward, sample.score, sample.partial)
            tiles.append(Tile(sample.image, caption, text, passed))
        sheet_rows.append((label, tiles))
    if sheet_rows[0][1][0].image.ndim == 4:  # clips [F, H, W, 3]: frame strips, and the same as a GIF
        from cosmos_rl.evaluation.grid import save_clips

        return save_clips(path, sheet_rows)[0]
    return save_sheet(path, sheet_rows)


def render(console, result: dict) -> None:
    """The result as rich tables, strict then partial: per task the score with its 95% interval (and
    the base's, and the change against it); outside text escaped."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    step = f" step {result['step']}" if result["step"] is not None else ""
    has_base = result["base_score"] is not None
    for part in ("", "_partial"):
        if result[f"score{part}"] is None:
            continue
        kind = "partial" if part else "strict"
        if result.get("closed_loop"):  # the slots hold success and the max coverage (commands.world_eval)
            kind = "max coverage" if part else "success rate"
        # A light box: three "0.500 [0.42, 0.58]" columns and the task names fit 80 columns.
        table = Table(title=f"eval: {escape(result['target'])}{step}, {kind} (95% interval over prompts)",
                      title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)  # fmt: skip
        table.add_column("task", no_wrap=True)
        for name in ("score", "base", "change") if has_base else ("score",):
            table.add_column(name, justify="right", no_wrap=True)

        def row(name: str, task: str | None) -> None:
            cells = [name]
            for prefix in ("", "base_", "diff_") if has_base else ("",):
                if task is None:
                    value, interval = result[f"{prefix}score{part}"], result.get(f"{prefix}score{part}_interval")
                else:
                    value = result[f"{prefix}tasks{part}"][task]
                    interval = (result.get(f"{prefix}tasks{part}_interval") or {}).get(task)
                cells.append(cell(value, interval, signed=prefix == "diff_"))
            table.add_row(*cells)

        for task in result["tasks"]:
            row(escape(task), task)
        table.add_section()
        row("[bold]overall[/]", None)
        console.print(table)
    sampler = result["sampler"]
    boot = result.get("bootstrap")
    console.print(
        f"{result['n_prompts']} prompts x seeds {result['seeds']} = {result['n_images']} images "
        f"({escape(result['prompts'])}); reward {escape(result['reward'])}; sampler {sampler['steps']} steps, "
        f"shift {sampler['shift']:g}, guidance {sampler['guidance']:g}; grid {escape(result['grid'])}"
        + (f"; intervals: {boot['resamples']} bootstrap resamples of the prompts, seed {boot['seed']}"
           + ("; change: checkpoint minus base, paired per prompt" if has_base else "") if boot else ""),
        highlight=False,
    )  # fmt: skip


def closing_lines(target: str, result: dict, seconds: float) -> list[str]:
    """The closing summary of `cosmos-rl eval`: the headline scores, the time, the files written
    and what to run next, one plain line each (a log reads them after the tables)."""
    import shlex

    from cosmos_rl.commands.run_summary import clock

    def scored(prefix: str) -> str:
        return cell(result[f"{prefix}score"], result.get(f"{prefix}score_interval"), signed=prefix == "diff_")

    folder = Path(result["grid"]).parent
    head = f"done: eval of {target} in {clock(seconds)}: {result['n_images']} images per model, score {scored('')}"
    if result.get("base_score") is not None:
        head += f", base {scored('base_')}, change {scored('diff_')}"
    # A closed-loop evaluation's sheet is its GIF (grid and grid_gif name one file): listed once.
    files = list(dict.fromkeys([str(folder / RESULT_FILE), result["grid"], *([result["grid_gif"]] if result.get("grid_gif") else [])]))
    lines = [head, f"  wrote: {', '.join(files)}"]
    if result["kind"] == "run":
        run = shlex.quote(target)
        lines += ["  next:", f"    cosmos-rl report {run}    # the run's curves with these scores and this grid",
                  f"    cosmos-rl export {run} --out {shlex.quote('models/' + Path(target).resolve().name)}    # the checkpoint as a model folder"]  # fmt: skip
    else:
        lines += ["  next:", f"    cosmos-rl compare RUN_DIR ... --base-eval {shlex.quote(str(folder / RESULT_FILE))}    # when this model is the runs' base"]
    return lines
