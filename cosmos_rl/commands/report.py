"""`cosmos-rl report RUN_DIR`: metric plots and a Markdown summary of one run directory.

Reads only the run directory's files (`manifest.toml`, `metrics.jsonl`, `checkpoints/`,
`samples/`, and `eval/` once `cosmos-rl eval RUN_DIR` has written its grid there), so it works on a finished run, a running one, or a copy pulled off a cluster, and never
imports torch. Plots use matplotlib's object API with the Agg canvas (no pyplot, no display).

A video run's grids are clips: `samples/step_<N>.png` and `eval/before_after.png` are then frame
strips, each with an animated GIF of the same name beside it; report.md embeds the GIF above its
strip. The held-out scores per task (`eval/task/<task>`, `eval/task_partial/<task>`) are drawn
as one panel per task, its score and partial score together (`plots/eval_task.png`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from pathlib import Path

import attrs

from cosmos_rl.checkpoint import layout
from cosmos_rl.core.errors import UserError
from cosmos_rl.commands.report_figures import Series, TASK_FIGURE, families, final_and_best, plot_family, plot_tasks

MANIFEST, METRICS, CHECKPOINTS, SAMPLES = "manifest.toml", "metrics.jsonl", "checkpoints", "samples"
# What `cosmos-rl eval RUN_DIR` writes (cosmos_rl.commands.evaluate); the report shows it when present.
EVAL_DIR, EVAL_GRID, EVAL_RESULT = "eval", "before_after.png", "eval.json"
GIF = ".gif"  # a clip grid's animated twin: the same name as its frame-strip PNG, this suffix

_STEP_PNG = re.compile(r"step_(\d+)\.png")


@attrs.frozen
class Run:
    path: Path
    manifest_text: str
    series: dict[str, Series]
    samples: tuple[tuple[int, Path], ...]  # (step, png), in step order
    checkpoints: tuple[int, ...]  # committed checkpoint steps
    eval_grid: Path | None = None  # eval/before_after.png
    eval_result: dict | None = None  # eval/eval.json


# ------------------------------------------------------------------------------------- reading
def load_run(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory; pass the folder `cosmos-rl train` created (<job.output_dir>/<job.name>)")
    manifest = run_dir / MANIFEST
    if not manifest.is_file():
        raise UserError(f"{manifest}: not found, so {run_dir} is not a run directory; pass the folder `cosmos-rl train` created")
    return Run(
        path=run_dir,
        manifest_text=_text(manifest, "the resolved manifest `cosmos-rl train` wrote"),
        series=read_metrics(run_dir / METRICS),
        samples=_sample_grids(run_dir / SAMPLES),
        checkpoints=_committed_steps(run_dir / CHECKPOINTS),
        eval_grid=grid if (grid := run_dir / EVAL_DIR / EVAL_GRID).is_file() else None,
        eval_result=_eval_result(run_dir / EVAL_DIR / EVAL_RESULT),
    )


def _eval_result(path: Path) -> dict | None:
    """The run's eval.json, checked field by field (commands.eval_result); None when there is none."""
    from cosmos_rl.commands import eval_result

    if not path.exists():
        return None
    return eval_result.read(path, str(path))


def read_metrics(path: Path) -> dict[str, Series]:
    """metrics.jsonl -> one Series per metric name; a repeated step keeps its last value (as a resume would)."""
    if not path.is_file():
        raise UserError(f"{path}: not found; the run has not written metrics yet (rank 0 writes a row every job.log_every steps)")
    points: dict[str, dict[int, float]] = defaultdict(dict)
    for number, line in enumerate(_text(path, "JSON rows").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row.pop("step"))
        except RecursionError:
            raise UserError(f"{path}:{number}: not a metrics row (JSON nested too deeply to read); each line must be a flat JSON object with \"step\"") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{path}:{number}: not a metrics row ({type(exc).__name__}: {exc}); each line must be a JSON object with \"step\"") from None
        for name, value in row.items():
            number_value = _as_float(value)
            if number_value is not None:
                points[name][step] = number_value
    if not points:
        raise UserError(f"{path}: holds no metric rows yet; wait for the first logged step (job.log_every) and run the report again")
    return {name: Series(name, tuple(sorted(by_step)), tuple(by_step[s] for s in sorted(by_step))) for name, by_step in sorted(points.items())}


def _text(path: Path, what: str) -> str:
    """A run file's text; a binary or unreadable one is the user's to fix (one line, no traceback)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text (it should hold {what}); restore it from a backup, or pass another run") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror}); check its permissions") from None


def _as_float(value) -> float | None:
    # MetricsWriter stores NaN/inf as the strings "nan"/"inf"; they stay visible as non-finite points.
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(value)
    return None


def _sample_grids(folder: Path) -> tuple[tuple[int, Path], ...]:
    if not folder.is_dir():
        return ()
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_PNG.fullmatch(p.name))]
    return tuple(sorted(found))


def gif_of(png: Path) -> Path | None:
    """The animated GIF written beside a clip grid's frame-strip PNG, if there is one (images: None)."""
    gif = png.with_suffix(GIF)
    return gif if gif.is_file() else None


def _committed_steps(folder: Path) -> tuple[int, ...]:
    return tuple(layout.committed_steps(folder))


# ------------------------------------------------------------------------------------- summary
def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Write plots and report.md for a run directory; returns the report.md path."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    plots = out / "plots"
    try:
        plots.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the report folder ({exc.strerror}); pass a writable --out") from None
    written = []
    base, base_note = base_line(run)
    for family, names in families(run.series).items():
        png = plots / f"{_safe(family)}.png"
        members = [run.series[n] for n in names]
        if family == TASK_FIGURE:
            plot_tasks(members, png)
        else:
            plot_family(family, members, png, base if family == "eval" and "eval/score" in names else None)
        written.append((family, png))
    report = out / "report.md"
    report.write_text(render_markdown(run, written, out, base_note), encoding="utf-8")
    return report


def base_line(run: Run) -> tuple[tuple[float, str] | None, str]:
    """(the base's score and its legend label, the note report.md puts under the eval figure): from
    `eval/eval.json` (`cosmos-rl eval RUN_DIR`) when it measured the base as the run's [rl.eval]
    measures eval/score (`measurement.differences`), so the line is the level the curve started
    from; else no line, and the note says why."""
    result = run.eval_result
    if result is None or result.get("base_score") is None or "eval/score" not in run.series:
        return None, ""
    from cosmos_rl.commands.measurement import base_of, differences, held_out_of
    from cosmos_rl.config import load

    try:
        config = load.load(run.path / MANIFEST, saved_run=True)
    except UserError as exc:
        return None, f"The base's score is not drawn: the manifest does not load ({' '.join(str(exc).split())})."
    held_out = held_out_of(config)
    differ = differences(result, held_out, base_of(config)) if held_out is not None else ["no [rl.eval]"]
    if differ:
        return None, (f"The base's score in {EVAL_DIR}/{EVAL_RESULT} is not drawn: it was measured otherwise than eval/score "
                      f"({'; '.join(differ)}).")  # fmt: skip
    score = float(result["base_score"])
    return (score, f"base {score:.3f} ({EVAL_DIR}/{EVAL_RESULT})"), (
        f"The dashed line is the base's score, {score:.3f}, from {EVAL_DIR}/{EVAL_RESULT}: the same prompts, seeds, reward and "
        "sampler as eval/score, so it is where the curve starts from.")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _fmt(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def _number(value) -> str:
    return _fmt(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _link(target: Path, base: Path) -> str:
    # Relative links keep the report readable wherever the run directory is copied.
    return Path(os.path.relpath(target.resolve(), base.resolve())).as_posix()


def render_markdown(run: Run, plots: list[tuple[str, Path]], out: Path, base_note: str = "") -> str:
    lines = [f"# Run report: {run.path.resolve().name}", "", f"Run directory: `{run.path.resolve()}`", ""]
    lines += ["## Final values", "", "| metric | last (step) | best (step) |", "| --- | --- | --- |"]
    for name, series in run.series.items():
        (last_step, last), best = final_and_best(series)
        best_text = f"{_fmt(best[1])} ({best[0]})" if best else "n/a"
        lines.append(f"| `{name}` | {_fmt(last)} ({last_step}) | {best_text} |")
    lines += ["", "Best is the maximum for accuracy, reward_mean, reward_margin and every eval/ score, the minimum",
              "for losses and timings; other metrics (spreads, advantages, branch errors, lr, grad_norm) show n/a.", ""]
    lines += ["## Curves", ""]
    for family, png in plots:
        note = ["One panel per task: its held-out score and partial score against steps.", ""] if family == TASK_FIGURE else []
        if family == "eval" and base_note:
            note = [base_note, ""]
        lines += [f"### {family}", "", *note, f"![{family}]({_link(png, out)})", ""]
    if run.samples:
        clips = any(gif_of(png) for _, png in run.samples)
        lines += ["## Sample grids", "", "The step's samples, oldest first" + (
            ": each clip plays in the GIF, and its frames run left to right in the strip below it." if clips else "."), ""]
        for step, png in run.samples:
            gif = gif_of(png)
            shown = [f"![samples at step {step} (animated)]({_link(gif, out)})", ""] if gif else []
            lines += [f"### step {step}", "", *shown, f"![samples at step {step}]({_link(png, out)})", ""]
    lines += _eval_section(run, out)
    lines += ["## Checkpoints", ""]
    lines.append(
        "Committed: " + ", ".join(f"`step_{s}`" for s in run.checkpoints) if run.checkpoints else "No committed checkpoint."
    )
    lines += ["", "## Resolved manifest", "", "```toml", run.manifest_text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def _eval_section(run: Run, out: Path) -> list[str]:
    """What `cosmos-rl eval RUN_DIR` wrote: the scores against the base, and the before/after grid."""
    result = run.eval_result
    if result is None and run.eval_grid is None:
        return []
    lines = ["## Evaluation", ""]
    if result is not None:
        lines += [
            f"`cosmos-rl eval` of checkpoint step {result.get('step')}: reward `{result.get('reward')}`, "
            f"{result.get('n_prompts')} prompts x seeds {result.get('seeds')} ({result.get('prompts')}).", "",
        ]  # fmt: skip
        boot = result.get("bootstrap")
        if isinstance(boot, dict):
            lines += [f"In brackets: the 95% bootstrap interval over prompts ({boot.get('resamples')} resamples, seed "
                      f"{boot.get('seed')}); the change is the checkpoint minus the base, paired prompt by prompt.", ""]  # fmt: skip
        lines += ["| task | score | base | change | partial | base partial | change partial |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for task in result["tasks"]:
            lines.append("| " + " | ".join([task, *_eval_cells(result, task)]) + " |")
        lines += ["| **overall** | " + " | ".join(_eval_cells(result, None)) + " |", ""]
    if run.eval_grid is not None:
        columns = " · ".join(f"{i + 1}. {p}" for i, p in enumerate((result or {}).get("grid_prompts", [])))
        gif = gif_of(run.eval_grid)
        if gif is None:
            lines += ["Before (top: the base) and after (bottom: the checkpoint), one prompt per column, each tile's verdict under it"
                      + (f": {columns}." if columns else "."), "", f"![before and after]({_link(run.eval_grid, out)})", ""]
        else:  # clips: the GIF has the image layout; the strips put each prompt's base and checkpoint on two lines
            lines += ["Before (top: the base) and after (bottom: the checkpoint), one prompt per column, each clip's verdict under it"
                      + (f": {columns}." if columns else "."), "", f"![before and after (animated)]({_link(gif, out)})", "",
                      "The same clips as frame strips (time runs rightwards), the base's above the checkpoint's for each prompt:", "",
                      f"![before and after, frame strips]({_link(run.eval_grid, out)})", ""]
    return lines


def _eval_cells(result: dict, task: str | None) -> list[str]:
    """The six cells of one task (None: overall) of an eval.json; n/a where it has no such number
    (no base, no partial score), the value alone where it predates the intervals."""
    from cosmos_rl.evaluation.intervals import cell

    cells = []
    for part in ("", "_partial"):
        for prefix in ("", "base_", "diff_"):
            if task is None:
                value, interval = result.get(f"{prefix}score{part}"), result.get(f"{prefix}score{part}_interval")
            else:
                value = (result.get(f"{prefix}tasks{part}") or {}).get(task)
                interval = (result.get(f"{prefix}tasks{part}_interval") or {}).get(task)
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            bounds = interval if isinstance(interval, list) and len(interval) == 2 and all(isinstance(b, (int, float)) for b in interval) else None
            cells.append(cell(float(number), bounds, signed=prefix == "diff_") if number is not None else "n/a")
    return cells
