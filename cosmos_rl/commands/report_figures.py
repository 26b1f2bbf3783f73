"""The report's figures: which metrics share a figure and in what order, each figure's labels and
which way is better, and the drawing itself (matplotlib's object API on the Agg canvas: no pyplot,
no display). `report.py` reads a run and writes report.md around them; `compare_output.py` draws
its curves with `draw_series`."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import attrs

# Every plot has this exact pixel size (inches x dpi), so a test can check the files are real plots;
# the per-task figure is a grid of panels of TASK_PANEL_IN each, TASK_COLUMNS to a row.
FIG_SIZE_IN, FIG_DPI = (6.4, 4.0), 100
TASK_PANEL_IN, TASK_COLUMNS = (3.2, 2.4), 3
# The per-task eval metrics (evaluation/scores.py EvalScores.metrics): one panel per task, not a family.
TASK_SCORE, TASK_PARTIAL, TASK_FIGURE = "eval/task/", "eval/task_partial/", "eval/task"

# Metrics read together in the specs' "is it training correctly" tables share one figure; every
# other metric gets its own, with its train/ and val/ curves as two lines.
JOINT_FAMILIES = {
    "reward_mean": "reward", "reward_std": "reward",
    "policy_loss": "loss_terms", "kl_loss": "loss_terms",
    "optimality_mean": "optimality", "optimality_second_moment": "optimality",
    "positive_error": "branch_errors", "negative_error": "branch_errors",
    "policy_mse_winner": "mse", "policy_mse_loser": "mse", "ref_mse_winner": "mse", "ref_mse_loser": "mse",
}

# The figures in reading order: the held-out score and the reward first (what a run is for), then
# the losses and the pair metrics, the other curves by name, the optimizer's and the timings last
# (alphabetical order put a flat advantage_mean first).
FIRST_FIGURES = ("eval", TASK_FIGURE, "reward", "loss", "loss_terms", "dpo_accuracy", "dpo_reward_margin")
LAST_FIGURES = ("grad_norm", "lr", "time")

# Each figure's y axis: what its values are; any other figure is labelled with its name.
Y_LABELS = {
    "eval": "held-out score", TASK_FIGURE: "held-out score", "reward": "reward per sample", "loss": "loss", "loss_terms": "loss",
    "time": "seconds per step", "lr": "learning rate", "grad_norm": "gradient norm", "mse": "mean squared error",
    "dpo_accuracy": "fraction of pairs ranked right", "dpo_reward_margin": "implicit reward margin",
}  # fmt: skip

# Which way is better, by the end of the metric name; the rest (reward_std, advantage_mean, the
# branch errors, lr, grad_norm) have no better direction, so the report shows no "best" for them.
HIGHER_IS_BETTER = ("accuracy", "reward_mean", "reward_margin")
HIGHER_IS_BETTER_PREFIXES = ("eval/",)  # every eval/ metric is a score
LOWER_IS_BETTER = ("loss",)

@attrs.frozen
class Series:
    name: str
    steps: tuple[int, ...]
    values: tuple[float, ...]



def families(names) -> dict[str, list[str]]:
    """Group metric names into figures: train/X and val/X together, joint families, time/* together."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        prefix, _, suffix = name.rpartition("/")
        if name.startswith((TASK_SCORE, TASK_PARTIAL)):
            key = TASK_FIGURE  # drawn by plot_tasks, a panel per task
        elif prefix in ("train", "val"):
            key = JOINT_FAMILIES.get(suffix, suffix)
        else:
            key = prefix or suffix  # time/* -> "time"; an unprefixed metric stands alone
        groups[key].append(name)
    return dict(sorted(groups.items(), key=lambda item: figure_rank(*item)))


def figure_rank(family: str, names: list[str]) -> tuple:
    """Where a figure goes (FIRST_FIGURES, then the others by name, LAST_FIGURES): a figure of one
    reward's own curves (several rewards: `train/<name>/reward_mean`) goes with the reward's."""
    if family in FIRST_FIGURES:
        return (0, FIRST_FIGURES.index(family), family)
    if all(name.rsplit("/", 1)[-1].startswith("reward_") for name in names):
        return (0, FIRST_FIGURES.index("reward"), family)
    if family in LAST_FIGURES:
        return (2, LAST_FIGURES.index(family), family)
    return (1, 0, family)


def y_label(family: str) -> str:
    return Y_LABELS.get(family, family.rsplit("/", 1)[-1].replace("_", " "))


def direction(name: str) -> str:
    if name.endswith(HIGHER_IS_BETTER) or name.startswith(HIGHER_IS_BETTER_PREFIXES):
        return "max"
    if name.endswith(LOWER_IS_BETTER) or name.startswith("time/"):
        return "min"
    return ""


def final_and_best(series: Series) -> tuple[tuple[int, float], tuple[int, float] | None]:
    last = (series.steps[-1], series.values[-1])
    finite = [(v, s) for s, v in zip(series.steps, series.values) if math.isfinite(v)]
    way = direction(series.name)
    if not way or not finite:
        return last, None
    value, step = (max if way == "max" else min)(finite, key=lambda vs: vs[0])
    return last, (step, value)


# --------------------------------------------------------------------------------------- plots
def family_figure(title: str, members: list[Series], base: tuple[float, str] | None = None):
    """The matplotlib Figure of one family: its curves against steps, the y axis labelled
    (`y_label`), and `base` (score, label), when given, as a dashed horizontal line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIG_SIZE_IN, dpi=FIG_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if base is not None:
        ax.axhline(base[0], linestyle="--", linewidth=1.2, color="0.35", label=base[1])
    draw_series(ax, members)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(y_label(title))
    fig.tight_layout()  # re-lays out axes inside the fixed canvas; the pixel size stays FIG_SIZE_IN x FIG_DPI
    return fig


def plot_family(title: str, members: list[Series], path: Path, base: tuple[float, str] | None = None) -> None:
    family_figure(title, members, base).savefig(path, dpi=FIG_DPI)


def task_panels(members: list[Series]) -> dict[str, list[Series]]:
    """{task: [its score, its partial score when logged]} of the eval/task/ and eval/task_partial/
    series, tasks in name order, each series renamed "score" / "partial" for the panel's legend."""
    panels: dict[str, list[Series]] = defaultdict(list)
    for prefix, label in ((TASK_SCORE, "score"), (TASK_PARTIAL, "partial")):
        for s in members:
            if s.name.startswith(prefix):
                panels[s.name[len(prefix):]].append(Series(label, s.steps, s.values))
    return dict(sorted(panels.items()))


def task_figure_px(tasks: int) -> tuple[int, int]:
    """The per-task figure's pixel size for `tasks` panels."""
    columns, rows = min(tasks, TASK_COLUMNS), math.ceil(tasks / TASK_COLUMNS)
    return round(TASK_PANEL_IN[0] * columns * FIG_DPI), round(TASK_PANEL_IN[1] * rows * FIG_DPI)


def plot_tasks(members: list[Series], path: Path) -> None:
    """One panel per task (score and partial against steps), all on one y scale so tasks compare at a glance."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = task_panels(members)
    width, height = task_figure_px(len(panels))
    fig = Figure(figsize=(width / FIG_DPI, height / FIG_DPI), dpi=FIG_DPI)
    FigureCanvasAgg(fig)
    columns = min(len(panels), TASK_COLUMNS)
    axes = fig.subplots(math.ceil(len(panels) / TASK_COLUMNS), columns, sharey=True, squeeze=False).ravel()
    for ax, (task, series) in zip(axes, panels.items()):
        draw_series(ax, series)
        ax.set_title(task, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)  # the last row's unused panels
    fig.suptitle("eval/ per task", fontsize=10)
    fig.supxlabel("step", fontsize=8)
    fig.supylabel(y_label(TASK_FIGURE), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=FIG_DPI)


def draw_series(ax, members: list[Series]) -> None:
    """Draw `members` on the matplotlib axes `ax` (x: each Series' steps, which may be any numbers):
    an `X_lo`/`X_hi` pair as X's interval band, an `X_std` as a band around `X_mean`, the rest as
    lines (markers when sparse); grid and legend. `cosmos-rl compare` draws its panels with it too."""
    by_name = {s.name: s for s in members}
    for s in members:
        low = by_name.get(s.name[: -len("_hi")] + "_lo") if s.name.endswith("_hi") else None
        high = by_name.get(s.name[: -len("_lo")] + "_hi") if s.name.endswith("_lo") else None
        if low is not None and low.steps == s.steps:
            continue  # drawn with its _lo as one band
        if high is not None and high.steps == s.steps:
            # An interval (eval/score_lo, eval/score_hi) is a band around its score, not two more lines.
            ax.fill_between(s.steps, s.values, high.values, alpha=0.2, label=f"{s.name[: -len('_lo')]} 95% interval")
            continue
        mean = by_name.get(s.name[: -len("_std")] + "_mean") if s.name.endswith("_std") else None
        if mean is not None and mean.steps == s.steps:
            # A spread drawn as its own line would share the mean's axis and flatten it; show it as a band.
            low = [m - d for m, d in zip(mean.values, s.values)]
            high = [m + d for m, d in zip(mean.values, s.values)]
            ax.fill_between(s.steps, low, high, alpha=0.25, label=f"{mean.name} ± {s.name.rsplit('/', 1)[-1]}")
            continue
        # Sparse series (validation every N steps) get markers so single points are visible.
        sparse = len(s.steps) < 30 or s.name.startswith(("val/", "eval/"))
        ax.plot(s.steps, s.values, label=s.name, marker="o" if sparse else None, markersize=3, linewidth=1.2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


# -------------------------------------------------------------------------------------- report
