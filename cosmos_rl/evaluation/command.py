"""`cosmos-rl eval TARGET`: score a run's newest checkpoint against its base (or a bare model) on
held-out prompts x fixed seeds, print the scores, write the sample grid and `eval.json`.

The result object (printed by `--json`, written to `<out>/eval.json`) is documented in
docs/eval.md; `score` is the headline (strict with the shapes verifier).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from cosmos_rl.errors import UserError
from cosmos_rl.evaluation.prompts import DEFAULT_PER_TASK, DEFAULT_SEEDS, eval_captions, overlap, spread
from cosmos_rl.evaluation.scores import EvalScores, caption_groups, reward_names
from cosmos_rl.config.sampler import DEFAULT_BATCH

DEFAULT_REWARD = "shapes_strict"
GRID_COLUMNS = 8  # prompts shown in the grid (seed 0), evenly spread over the evaluation's prompts
RESULT_FILE = "eval.json"


def check_options(seeds: int, per_task: int, reward: str, batch_size: int) -> None:
    if seeds < 1:
        raise UserError(f"--seeds: must be >= 1 (got {seeds}); seeds 0 .. N-1 are used on every call")
    if per_task < 0:
        raise UserError(f"--per-task: must be >= 0 (got {per_task}); 0 takes every held-out prompt")
    check_sampling_options(reward, batch_size)


def check_sampling_options(reward: str, batch_size: int) -> None:
    """The options every command that samples and scores with a built-in reward shares (eval, pairs mine)."""
    if batch_size < 1:
        raise UserError(f"--batch-size: must be >= 1 (got {batch_size})")
    if reward not in reward_names():
        raise UserError(f"--reward: {reward!r} is not a built-in weight-free reward; use one of {', '.join(reward_names())}")


def check_sampler_overrides(sample_steps: int | None, guidance: float | None) -> None:
    if sample_steps is not None and sample_steps < 1:
        raise UserError(f"--sample-steps: must be >= 1 (got {sample_steps})")
    if guidance is not None and not guidance >= 0:
        raise UserError(f"--guidance: must be >= 0 (got {guidance}); 1 is conditional only")


def run_eval(
    target: str, *, prompts: Path | None = None, seeds: int = DEFAULT_SEEDS, per_task: int = DEFAULT_PER_TASK,
    reward: str = DEFAULT_REWARD, batch_size: int = DEFAULT_BATCH, image_size: int | None = None,
    out_dir: Path | None = None, device: str = "auto", warn: Callable[[str], None] = lambda line: None,
    sample_steps: int | None = None, guidance: float | None = None, step: int | None = None,
) -> dict:  # fmt: skip
    """Evaluate `target` and return the result object (see docs/eval.md); `warn` gets warning lines.

    `sample_steps` / `guidance` replace the target's own sampler settings (to compare models of
    different runs under one sampler); None keeps them."""
    check_options(seeds, per_task, reward, batch_size)
    check_sampler_overrides(sample_steps, guidance)
    captions, described = eval_captions(prompts, per_task)
    origin = f"--prompts {prompts}" if prompts else "the held-out prompts"
    caption_groups(captions, reward, origin)  # a bad prompt or TARGET fails before torch is even imported
    if image_size is not None and image_size < 1:
        raise UserError(f"--image-size: must be >= 1 (got {image_size})")
    from cosmos_rl.evaluation.target import open_target
    from cosmos_rl.models.media import MediaSpec, latent_shape

    media = MediaSpec.image(image_size) if image_size is not None else None
    t = open_target(target, step=step, media=media, out_dir=out_dir)  # refuses before anything loads
    from cosmos_rl.dist.world import pick_device
    from cosmos_rl.evaluation.evaluator import Evaluator

    where = pick_device(device)
    model = t.load(where)
    t.settings = t.settings.replaced(sample_steps, guidance)
    train_prompts = t.train_prompts()
    if train_prompts is not None:
        seen = overlap(train_prompts, captions)
        if seen:
            warn(f"{len(seen)} of the {len(captions)} evaluation prompts are training prompts of the run (e.g. {seen[0]!r}): "
                 "their scores measure memory, not generalisation")  # fmt: skip
    evaluator = Evaluator(
        captions, seeds, reward, t.settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae, media=t.media,
        latent_shape=latent_shape(t.media, model.parts.vae.config, model.parts.transformer.config), device=where, batch_size=batch_size, origin=origin,
        model_parts=model.model_parts,
    )  # fmt: skip
    columns = [item.index for item in spread(evaluator.items[: len(captions)], GRID_COLUMNS)]
    keep = frozenset(columns)
    with model.policy() as network:
        totals, policy_images = evaluator.totals(network, keep=keep)
    scores = totals.scores(reward)
    base, base_images = None, {}
    if model.base is not None:
        with model.base() as network:
            base_totals, base_images = evaluator.totals(network, keep=keep)
        base = base_totals.scores(reward)
    grid = write_grid(t.out_dir / ("before_after.png" if base is not None else "samples.png"),
                      [base_images, policy_images] if base is not None else [policy_images], columns)  # fmt: skip
    result = {
        "target": t.label, "kind": t.kind, "step": t.step, "reward": reward,
        **_scores_json(scores, ""), **(_scores_json(base, "base_") if base else _scores_json(None, "base_")),
        "n_prompts": len(captions), "seeds": list(range(seeds)), "n_images": len(evaluator.items),
        "prompts": described, "sampler": t.settings.resolved(model.model_parts).as_json(), "image_size": t.media.size_json(),
        "grid": str(grid), "grid_prompts": [evaluator.items[i].caption for i in columns],
    }  # fmt: skip
    (t.out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def _scores_json(scores: EvalScores | None, prefix: str) -> dict:
    if scores is None:
        return {f"{prefix}score": None, f"{prefix}score_partial": None, f"{prefix}tasks": None, f"{prefix}tasks_partial": None}
    return {
        f"{prefix}score": scores.score, f"{prefix}score_partial": scores.score_partial,
        f"{prefix}tasks": scores.tasks, f"{prefix}tasks_partial": scores.tasks_partial,
    }  # fmt: skip


def write_grid(path: Path, rows: list[dict], columns: list[int]) -> Path:
    """One row per image set (base above the policy), one column per kept item."""
    import numpy as np
    import torch

    from cosmos_rl.data.images import save_image_grid
    from cosmos_rl.data.pixels import to_unit_float

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path.parent}: cannot create the evaluation folder ({exc.strerror}); pass a writable --out") from None
    pixels = np.stack([row[i] for row in rows for i in columns])  # uint8 [rows * columns, H, W, 3]
    return save_image_grid(torch.from_numpy(to_unit_float(pixels)).permute(0, 3, 1, 2), path, nrow=len(columns))


def render(console, result: dict) -> None:
    """The result as a rich table: per task score and partial (and the base's); outside text escaped."""
    from rich.markup import escape
    from rich.table import Table

    step = f" step {result['step']}" if result["step"] is not None else ""
    table = Table(title=f"eval: {escape(result['target'])}{step}", title_justify="left")
    has_base, has_partial = result["base_score"] is not None, result["score_partial"] is not None
    table.add_column("task")
    table.add_column("score", justify="right")
    if has_partial:
        table.add_column("partial", justify="right")
    if has_base:
        table.add_column("base", justify="right")
        if has_partial:
            table.add_column("base partial", justify="right")

    def row(name: str, task: str | None) -> None:
        def value(prefix: str, partial: bool) -> str:
            if task is None:
                number = result[f"{prefix}score_partial" if partial else f"{prefix}score"]
            else:
                number = result[f"{prefix}tasks_partial" if partial else f"{prefix}tasks"][task]
            return f"{number:.3f}"

        cells = [name, value("", False)]
        if has_partial:
            cells.append(value("", True))
        if has_base:
            cells.append(value("base_", False))
            if has_partial:
                cells.append(value("base_", True))
        table.add_row(*cells)

    for task in result["tasks"]:
        row(escape(task), task)
    table.add_section()
    row("[bold]overall[/]", None)
    console.print(table)
    sampler = result["sampler"]
    console.print(
        f"{result['n_prompts']} prompts x seeds {result['seeds']} = {result['n_images']} images "
        f"({escape(result['prompts'])}); reward {escape(result['reward'])}; sampler {sampler['steps']} steps, "
        f"shift {sampler['shift']:g}, guidance {sampler['guidance']:g}; grid {escape(result['grid'])}",
        highlight=False,
    )
