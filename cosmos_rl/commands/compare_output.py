"""`cosmos-rl compare`'s output: `compare.json`, `compare.png` and the printed tables, from the
result `compare.compare` builds (what the figures mean: cosmos_rl/commands/compare.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from cosmos_rl.commands.compare import FIG_DPI, FIG_SIZE_IN, FIGURE_FILE, JSON_FILE, SCORE
from cosmos_rl.core.errors import UserError
from cosmos_rl.commands.report_figures import Series


def write(result: dict, out_dir: Path) -> tuple[Path, Path]:
    """compare.json and compare.png in `out_dir` (created)."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # allow_nan=False: docs/eval.md promises strict JSON; every number is finite by compare's checks.
        (out_dir / JSON_FILE).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot write the comparison there ({exc.strerror}); pass a writable folder") from None
    figure = out_dir / FIGURE_FILE
    plot(result, figure)
    return out_dir / JSON_FILE, figure


def plot(result: dict, path: Path) -> None:
    """`figure(result)` saved as a PNG at `path`."""
    figure(result).savefig(path, dpi=FIG_DPI)


def figure(result: dict):
    """Four panels: eval/score against steps, images and wall-clock (one line and interval band per
    run; the base and base + margin as lines when --base-score is given), and the final paired
    change per task with its 95% interval (from eval.json). A run keeps one colour in every panel,
    also where another run has no point (no wall-clock, no eval.json)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cosmos_rl.commands.report_figures import draw_series

    fig = Figure(figsize=FIG_SIZE_IN, dpi=FIG_DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    colours = run_colours(result)
    for ax, (x, label) in zip(axes.flat, [("step", "optimizer step"), ("images", "images (generated or seen)"), ("wall_s", "wall-clock s (time/*)")]):
        members = []
        for run in result["runs"]:
            points = [p for p in run["curve"] if p[x] is not None]
            if not points:
                continue
            xs = tuple(p[x] for p in points)
            members.append(Series(run["name"], xs, tuple(p["score"] for p in points)))
            if all(p["lo"] is not None for p in points):
                members.append(Series(run["name"] + "_lo", xs, tuple(p["lo"] for p in points)))
                members.append(Series(run["name"] + "_hi", xs, tuple(p["hi"] for p in points)))
        if result["base_score"] is not None:
            ax.axhline(result["base_score"], color="grey", linewidth=1, label="base")
            ax.axhline(result["threshold"], color="grey", linewidth=1, linestyle="--", label=f"base + {result['margin']:g}")
        if members:
            draw_series(ax, members)
            _recolour(ax, colours)
        else:
            ax.text(0.5, 0.5, "no run has this axis", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(label)
        ax.set_ylabel(SCORE)
    _plot_changes(axes[1, 1], result, colours)
    fig.tight_layout()
    return fig


def _recolour(ax, colours: dict[str, str]) -> None:
    """Each run's line and interval band in its own colour (the axes' cycle would shift past a run
    missing from this panel), and the legend drawn again to match."""
    for line in ax.get_lines():
        if line.get_label() in colours:
            line.set_color(colours[line.get_label()])
    for band in ax.collections:
        name = band.get_label().removesuffix(" 95% interval")
        if name in colours:
            band.set_facecolor(colours[name])
    ax.legend(fontsize=8)


def run_colours(result: dict) -> dict[str, str]:
    """Each run's colour, by its place on the command line (matplotlib's default cycle)."""
    return {run["name"]: f"C{i % 10}" for i, run in enumerate(result["runs"])}


def _plot_changes(ax, result: dict, colours: dict[str, str]) -> None:
    finals = [(run["name"], run["final"]) for run in result["runs"] if run["final"]]
    ax.set_title("final change vs base (eval.json, paired, 95%)", fontsize=9)
    if not finals:
        ax.text(0.5, 0.5, "no eval.json", ha="center", va="center", transform=ax.transAxes)
        return
    labels = ["overall", *finals[0][1]["tasks"]]
    width = 0.8 / len(finals)
    for i, (name, final) in enumerate(finals):
        changes = [final["change"], *(final["tasks"][t]["change"] for t in labels[1:])]
        xs = [k + (i - (len(finals) - 1) / 2) * width for k in range(len(labels))]
        values = [c["value"] if c["value"] is not None else math.nan for c in changes]
        # A zero-width interval (a task of one prompt) can sit a rounding error past its value: clamp at 0.
        errors = [[max(0.0, v - c["interval"][0]) if c["interval"] else 0 for v, c in zip(values, changes)],
                  [max(0.0, c["interval"][1] - v) if c["interval"] else 0 for v, c in zip(values, changes)]]  # fmt: skip
        ax.bar(xs, values, width, yerr=errors, capsize=2, label=name, color=colours[name])
    ax.axhline(0, color="grey", linewidth=1)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def _number(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _count(value) -> str:
    return "n/a" if value is None else f"{value:,}"


def _seconds(value) -> str:
    return "n/a" if value is None else f"{value:.0f} s"


def render(console, result: dict, files: tuple[Path, Path] | None = None) -> None:
    """The comparison as rich tables (outside text escaped): the curves' figures per run, then the
    final paired changes per task."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from cosmos_rl.evaluation.intervals import cell

    threshold = result["threshold"]
    # One column per run, one row per figure: a handful of runs fit 80 columns.
    table = Table(title="compare: in-training held-out eval/score", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("")
    for run in result["runs"]:
        table.add_column(escape(run["name"]), justify="right")
    reach = f"first >= {threshold:.3f} (base + {result['margin']:g})" if threshold is not None else None
    rows: dict[str, list[str]] = {}
    for run in result["runs"]:
        images, last, best, hit = run["images"], run["last_eval"], run["best_eval"], run["first_reach"]
        figures = {
            "algorithm": escape(run["algorithm"]),
            "images a step": "n/a" if images["per_step"] is None else f"{images['per_step']:,} {images['kind']}",
            "images before step 1": _count(images["before_step_1"]),
            "steps": str(run["last_step"]),
            "images": _count(images["at_last_step"]),
            "wall-clock (time/*)": _seconds(run["wall_s"]),
            "last eval/score": f"{_number(last['score'])} @ {last['step']}" if last else "n/a",
            "best eval/score": f"{_number(best['score'])} @ {best['step']}" if best else "n/a",
        }  # fmt: skip
        if reach is not None:
            missing = "not reached" if run["curve"] else "n/a"
            figures[reach + ": step"] = str(hit["step"]) if hit else missing
            figures["  images then"] = _count(hit["images"]) if hit else missing
            figures["  wall-clock then"] = _seconds(hit["wall_s"]) if hit else missing
        for key, value in figures.items():
            rows.setdefault(key, []).append(value)
    for key, values in rows.items():
        table.add_row(key, *values)
    console.print(table)
    finals = [run for run in result["runs"] if run["final"]]
    if finals:
        tasks = list(finals[0]["final"]["tasks"])
        base = result["final_base"] or {}
        final = Table(title="compare: final change vs the common base (eval.json; paired, 95% interval over prompts)",
                      title_justify="left", box=box.SIMPLE_HEAD)  # fmt: skip
        final.add_column("task")
        final.add_column("base", justify="right")
        for run in finals:
            final.add_column(f"{escape(run['name'])} (step {run['final']['step']})", justify="right")
        for task in [*tasks, None]:
            label = "[bold]overall[/]" if task is None else escape(task)
            base_value = base.get("score") if task is None else (base.get("tasks") or {}).get(task)
            cells = []
            for run in finals:
                change = run["final"]["change"] if task is None else run["final"]["tasks"][task]["change"]
                cells.append(cell(change["value"], change["interval"], signed=True))
            if task is None:
                final.add_section()
            final.add_row(label, _number(base_value), *cells)
        scores = ["final score: " + ", ".join(f"{escape(r['name'])} {cell(r['final']['score']['value'], r['final']['score']['interval'])}" for r in finals)]
        console.print(final)
        console.print(scores[0], highlight=False)
        _render_against_first(console, result, tasks)
    for run in result["runs"]:
        for note in run["notes"]:
            console.print(f"note: {escape(run['name'])}: {escape(note)}", highlight=False)
    if threshold is None:
        console.print("first step to base + margin: pass --base-eval (the base's eval.json under the runs' [rl.eval]) or --base-score",
                      markup=False, highlight=False)  # fmt: skip
    else:
        console.print(f"base score {result['base_score']:.3f} (from {escape(result['base_score_from'])}), threshold {threshold:.3f}", highlight=False)
    if files:
        console.print(f"[bold green]wrote[/] {escape(str(files[0]))}, {escape(str(files[1]))}", highlight=False)


def _render_against_first(console, result: dict, tasks: list[str]) -> None:
    """The later runs' final checkpoints minus the first's, paired per prompt (compare.against)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from cosmos_rl.evaluation.intervals import cell

    paired_runs = [run for run in result["runs"] if run.get("against_first")]
    if not paired_runs:
        return
    first = paired_runs[0]["against_first"]["against"]
    table = Table(title=f"compare: final score minus {escape(first)}'s (eval.json; paired per prompt, 95% interval)",
                  title_justify="left", box=box.SIMPLE_HEAD)  # fmt: skip
    table.add_column("task")
    for run in paired_runs:
        table.add_column(escape(run["name"]), justify="right")
    for task in [*tasks, None]:
        if task is None:
            table.add_section()
        changes = [run["against_first"]["change"] if task is None else run["against_first"]["tasks"][task] for run in paired_runs]
        table.add_row("[bold]overall[/]" if task is None else escape(task),
                      *(cell(c["value"], c["interval"], signed=True) for c in changes))  # fmt: skip
    console.print(table)
