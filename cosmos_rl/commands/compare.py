"""`cosmos-rl compare RUN_DIR...`: runs side by side, from their run directories alone.

For each run: the in-training held-out curve (`eval/score` rows of `metrics.jsonl`, with their
`eval/score_lo`/`_hi` interval when written) against optimizer steps, against images and against
wall-clock; the final scores of `cosmos-rl eval RUN_DIR` (`eval/eval.json`: every task's score and
its paired change against the base, with 95% intervals); and, given the base's score under the
runs' in-training evaluation (`--base-eval` its eval.json, checked, or `--base-score`), the first
evaluated step at which the curve reaches base + margin. Output: rich tables, `compare.json` and `compare.png` (docs/eval.md, "Comparing
runs", documents both). Torch-free: it reads files, never a model.

**Images per step**, the x axis that puts algorithms on one budget (docs/eval.md states the same):

* online (NFT, GRPO: an `rl` table with `group_size` and `prompts_per_step`): images *generated*,
  `prompts_per_step x group_size` a step (each scored by the reward);
* DPO (`pairs_per_step`): images *seen*, `2 x pairs_per_step` (winner and loser); when the pair
  shards lie beside the `mine.json` that `cosmos-rl pairs mine` writes, the images it generated
  to mine them (`rows x samples`) are counted before step 1 ("mining counted");
* SFT (`samples_per_step`): images *seen*, `samples_per_step` ground-truth images a step.

**Wall-clock** is the sum of a logged row's `time/*` phases (the online step's rollout, reward,
train and orchestration seconds, each the mean per step over the steps the row covers: the step
loop writes them so), counted for that row and for the unlogged steps before it
(`job.log_every`); start-up, evaluation and checkpoints are not in it. A run whose rows carry no
`time/*` metric (DPO, SFT today) has none, shown as n/a, never as zero.

**What must agree** (else exit 2, naming both runs and the key): the base (`model.preset` or
`model.path`, the base weights `rl.init_from`, the media size), the in-training evaluation of the
runs that evaluate (`rl.eval` prompts, per_task, seeds, reward and the resolved sampler), and the
`eval.json` settings (reward, prompts, seeds, sampler, image size) and base scores of the runs
that have one: on identical noise one base scores the same every time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import read_user_json
from cosmos_rl.commands.measurement import base_of, differences, held_out_of
from cosmos_rl.commands.report import EVAL_DIR, EVAL_RESULT, MANIFEST, load_run
from cosmos_rl.evaluation.scores import score_range
from cosmos_rl.evaluation.served import eval_reward_name

SCORE = "eval/score"
MINE_SUMMARY = "mine.json"  # what `cosmos-rl pairs mine` writes beside its shards (mining.shards.SUMMARY_FILE)
DEFAULT_MARGIN = 0.1
JSON_FILE, FIGURE_FILE = "compare.json", "compare.png"
FIG_SIZE_IN, FIG_DPI = (12.8, 8.0), 100  # four panels of report.py's 6.4 x 4.0 in
_REACH_SLACK = 1e-9  # 0.235 + 0.1 is 0.33499999999999996: a score of 0.335 reaches it


@attrs.frozen
class ImageBudget:
    """How many images a run's step costs: `per_step` (`kind` "generated" or "seen"), plus `before`
    generated before step 1 (DPO's mining, when recorded)."""

    per_step: int | None
    kind: str
    before: int = 0
    note: str = ""

    def at(self, step: int) -> int | None:
        return None if self.per_step is None else self.before + step * self.per_step


@attrs.frozen
class Point:
    step: int
    score: float
    images: int | None
    wall_s: float | None
    lo: float | None = None
    hi: float | None = None


@attrs.frozen
class RunFigures:
    name: str
    path: Path
    algorithm: str
    last_step: int
    budget: ImageBudget
    curve: tuple[Point, ...]
    wall_s: float | None  # at the last logged step
    final: dict | None  # eval.json, as `cosmos-rl eval` wrote it
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------- pure figures
def cumulative_wall_clock(logged_steps, step_seconds: dict[int, float]) -> dict[int, float | None]:
    """Seconds spent by each logged step: a row at step r after a row at p (0 before the first)
    stands for the r - p steps since, each at its own `step_seconds[r]`. From the first logged row
    without timings on, the sum is unknown (None)."""
    out: dict[int, float | None] = {}
    total: float | None = 0.0
    previous = 0
    for step in sorted(logged_steps):
        seconds = step_seconds.get(step)
        total = None if total is None or seconds is None else total + (step - previous) * seconds
        if total is not None and not math.isfinite(total):  # finite timings past 1e308 s in all: no wall-clock
            total = None
        out[step] = total
        previous = step
    return out


def first_reach(curve, threshold: float) -> Point | None:
    """The first point of `curve` (in step order) whose score is at least `threshold`."""
    for point in sorted(curve, key=lambda p: p.step):
        if math.isfinite(point.score) and point.score >= threshold - _REACH_SLACK:
            return point
    return None


def image_budget(config, mined: int | None = None) -> ImageBudget:
    """The image cost of one step of a run (module docstring), as its algorithm's registry entry
    counts it (`image_count`), so a registered algorithm counts as the built-in of its kind."""
    rl, count = config.rl, algorithms.of(config).image_count
    if count == "group":
        return ImageBudget(rl.group_size * rl.prompts_per_step, "generated")
    if count == "pairs":
        if mined is None:
            return ImageBudget(2 * rl.pairs_per_step, "seen", 0, "the mining of its pairs is not counted (no mine.json beside the shards)")
        return ImageBudget(2 * rl.pairs_per_step, "seen", mined, f"{mined} images generated to mine its pairs counted before step 1")
    if count == "samples":
        return ImageBudget(rl.samples_per_step, "seen")
    return ImageBudget(None, "", 0, "no image count: its algorithm's registry entry names none (image_count)")


# ------------------------------------------------------------------------------------- reading
def _mined_images(rl) -> int | None:
    """Images `cosmos-rl pairs mine` generated for a DPO run's shards: rows x samples of the
    mine.json beside them (one per shard folder); None unless every shard folder has one."""
    shards = list(rl.data.shards)
    if not shards:
        return None
    total = 0
    for folder in sorted({Path(s).parent for s in shards}):
        path = folder / MINE_SUMMARY
        if not path.is_file():
            return None
        # A FIFO or a huge file named mine.json must not hang or fill memory: the bounded reader.
        summary = read_user_json(path, "compare", "pairs summary")
        try:
            rows, samples = summary["rows"], summary["samples"]
        except (KeyError, TypeError) as exc:
            raise UserError(f"{path}: not the summary `cosmos-rl pairs mine` writes ({type(exc).__name__}: {exc}); mine the pairs again, or delete it") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (rows, samples)):
            raise UserError(f"{path}: \"rows\" and \"samples\" must be counts (got {rows!r}, {samples!r}); mine the pairs again, or delete it")
        total += rows * samples
    return total


def final_settings(result: dict) -> dict:
    """The eval.json keys that make two evaluations the same measurement."""
    return {k: result.get(k) for k in ("reward", "prompts", "n_prompts", "seeds", "sampler", "image_size")}


def base_from_eval(path: Path, held_out: dict | None, base: dict) -> float:
    """The base's score from `cosmos-rl eval MODEL`'s eval.json at `path`, refused unless it is the
    runs' base (its target names their `rl.init_from` or model) measured as their [rl.eval] measures:
    the same prompts, seeds, reward, sampler steps and guidance (and shift, where the runs set one)
    and image size."""
    from cosmos_rl.commands import eval_result

    where = f"--base-eval {path}"
    result = eval_result.read(Path(path), where, tasks_needed=False, origin="--base-eval")  # types, ranges, finite numbers: one line naming the field
    if result.get("kind") != "model":
        raise UserError(f"{where}: not the eval.json of `cosmos-rl eval MODEL` (\"kind\": \"model\" and a \"score\"); evaluate the base model itself, e.g. `cosmos-rl eval preset:shapes`")
    if result.get("target") not in (base["init_from"], base["model"]):
        raise UserError(f"{where}: evaluates {result.get('target')!r}, but the runs start from {base['init_from']!r}; evaluate that base")
    if held_out is None:
        raise UserError(f"{where}: no run has in-training eval/score rows for this base score to be the base of; drop --base-eval")
    differ = differences(result, held_out, base, "the runs'")
    if differ:
        raise UserError(f"{where}: not measured as the runs' [rl.eval] measures ({'; '.join(differ)}); run `cosmos-rl eval` "
                        "on the base with their --prompts, --per-task, --seeds, --reward, --sample-steps and --guidance")  # fmt: skip
    return float(result["score"])


def read_run(run_dir: Path, name: str) -> tuple[RunFigures, object]:
    """A run directory's figures and its saved config (schema.RunConfig)."""
    from cosmos_rl.config import load

    run = load_run(run_dir)  # refuses a folder without manifest.toml or metrics.jsonl
    config = load.load(run.path / MANIFEST, saved_run=True)
    mined = _mined_images(config.rl) if isinstance(config.rl, schema.DPOConfig) else None
    budget = image_budget(config, mined)
    logged = sorted({s for series in run.series.values() for s in series.steps})
    seconds: dict[int, float] = {}
    for series in run.series.values():
        if series.name.startswith("time/"):
            for step, value in zip(series.steps, series.values):
                if math.isfinite(value) and math.isfinite(seconds.get(step, 0.0) + value):
                    seconds[step] = seconds.get(step, 0.0) + value
    wall = cumulative_wall_clock(logged, seconds)
    notes = [budget.note] if budget.note else []
    if not seconds:
        notes.append("no time/* metrics: wall-clock n/a")
    score = run.series.get(SCORE)
    scale = score_range(eval_reward_name(config))
    lo, hi = run.series.get(SCORE + "_lo"), run.series.get(SCORE + "_hi")
    bounds = {s: (a, b) for s, a, b in zip(lo.steps, lo.values, hi.values)} if lo and hi and lo.steps == hi.steps else {}
    curve = tuple(
        Point(step, value, budget.at(step), wall.get(step), *_bounds(bounds.get(step), scale))
        for step, value in _curve_scores(run.path, score, scale, notes)
    )  # fmt: skip
    if not curve:
        notes.append("no in-training eval/score rows (rl.eval.every = 0)")
    final = run.eval_result
    if final is None:
        notes.append(f"no {EVAL_DIR}/{EVAL_RESULT}: run `cosmos-rl eval {run.path}` for the final intervals")
    elif final.get("step") is not None and final["step"] != logged[-1]:
        notes.append(f"{EVAL_DIR}/{EVAL_RESULT} scores checkpoint step {final['step']}, the run logged up to step {logged[-1]}")
    figures = RunFigures(
        name=name, path=run.path, algorithm=config.rl.algorithm, last_step=logged[-1], budget=budget, curve=curve,
        wall_s=wall[logged[-1]], final=final, notes=tuple(notes),
    )  # fmt: skip
    return figures, config


def _curve_scores(path: Path, score, scale: tuple[float, float], notes: list[str]) -> list[tuple[int, float]]:
    """The (step, eval/score) points of the curve: a non-finite one (metrics.jsonl keeps a NaN as
    "nan") is left out with a note; a finite one outside `scale`, the range of rl.eval.reward's
    scores, is damage and refused."""
    points = []
    for step, value in zip(score.steps, score.values) if score else ():
        if not math.isfinite(value):
            notes.append(f"{SCORE} at step {step} is {value}: left out of the curve")
        elif not scale[0] - _REACH_SLACK <= value <= scale[1] + _REACH_SLACK:
            raise UserError(f"{path / 'metrics.jsonl'}: step {step}: {SCORE} = {value!r} is outside [{scale[0]:g}, {scale[1]:g}], "
                            "the range of rl.eval.reward's scores; the file is damaged: restore it, or leave the run out")  # fmt: skip
        else:
            points.append((step, value))
    return points


def _bounds(pair, scale: tuple[float, float]) -> tuple[float | None, float | None]:
    """A point's interval, when both ends are finite, ordered and inside the score's range."""
    if pair is None or not all(math.isfinite(v) and scale[0] - _REACH_SLACK <= v <= scale[1] + _REACH_SLACK for v in pair) or pair[0] > pair[1]:
        return None, None
    return pair


def _names(run_dirs: list[Path]) -> list[str]:
    """Each run's label: its folder's name, or the path as given where two names clash."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def _same(what: str, key_of, runs: list, fix: str) -> None:
    """Refuse (UserError) unless `key_of(run)` is one value over the runs it is not None for."""
    known = [(run, key_of(run)) for run in runs]
    known = [(run, key) for run, key in known if key is not None]
    for run, key in known[1:]:
        first, first_key = known[0]
        if key != first_key:
            differ = sorted(k for k in set(key) | set(first_key) if key.get(k) != first_key.get(k))
            shown = "; ".join(f"{k}: {first_key.get(k)!r} in {first.name}, {key.get(k)!r} in {run.name}" for k in differ)
            raise UserError(f"{what} differ ({shown}): the runs are not compared on one footing; {fix}")


def compare(
    run_dirs: list[Path], *, base_score: float | None = None, base_eval: Path | None = None, margin: float = DEFAULT_MARGIN
) -> dict:
    """The comparison as one JSON-able object (docs/eval.md, "Comparing runs"); refuses mismatches.
    The base's in-training-comparable score is `base_score` (taken as given) or read, checked, from
    the eval.json `base_eval`; with neither there is no 'first step to base + margin'."""
    if not run_dirs:
        raise UserError("RUN_DIR: pass at least one run directory")
    resolved = [Path(d).resolve() for d in run_dirs]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise UserError(f"RUN_DIR {run_dirs[i]}: given twice; pass each run directory once")
    if base_score is not None and base_eval is not None:
        raise UserError("--base-score and --base-eval: pass one (a number you vouch for, or the base's eval.json, which is checked)")
    if base_score is not None and not math.isfinite(base_score):
        raise UserError(f"--base-score: must be a finite number (got {base_score})")
    if not math.isfinite(margin):
        raise UserError(f"--margin: must be a finite number (got {margin})")
    pairs = [read_run(Path(d), n) for d, n in zip(run_dirs, _names(run_dirs))]
    runs = [figures for figures, _ in pairs]
    configs = {figures.name: config for figures, config in pairs}
    # A score and a gain outside what the runs' reward can score are typos, and 1e308 breaks the plot's axes.
    reward = eval_reward_name(configs[runs[0].name])
    lo, hi = score_range(reward)
    if base_score is not None and not lo <= base_score <= hi:
        raise UserError(f"--base-score: {base_score:g} is outside [{lo:g}, {hi:g}], the range of the runs' rl.eval.reward "
                        f"({reward or 'the suite verifier'}) scores; pass the base's score")  # fmt: skip
    if not -(hi - lo) <= margin <= hi - lo:
        raise UserError(f"--margin: {margin:g} is more than the runs' rl.eval.reward can change a score ({hi - lo:g}); pass a smaller gain")
    _same("the bases (model, rl.init_from, media)", lambda r: base_of(configs[r.name]), runs,
          "compare runs that post-train the same base")  # fmt: skip
    _same("the in-training held-out evaluations ([rl.eval] and its sampler)", lambda r: held_out_of(configs[r.name]) if r.curve else None,
          runs, "train the runs with the same rl.eval.* (prompts, per_task, seeds, reward, sample_steps, guidance)")  # fmt: skip
    _same(f"the {EVAL_RESULT} settings", lambda r: final_settings(r.final) if r.final else None, runs,
          "run `cosmos-rl eval` on every run with the same --prompts, --per-task, --seeds, --reward, --sample-steps and --guidance")  # fmt: skip
    _same(f"the base's scores in {EVAL_RESULT}", lambda r: _base_scores(r.final) if r.final else None, runs,
          "on identical settings one base scores alike: the runs have different bases, or an eval.json is stale (run `cosmos-rl eval` again)")  # fmt: skip
    held_out = next((held_out_of(configs[r.name]) for r in runs if r.curve), None)
    base = base_of(configs[runs[0].name])
    if base_eval is not None:
        base_score = base_from_eval(base_eval, held_out, base)
    threshold = None if base_score is None else base_score + margin
    first = next((r for r in runs if r.final), None)  # the first run with an eval.json: the reference of against()
    final = first.final if first else None
    return {
        "base": base,
        "held_out": held_out,
        "final_settings": final_settings(final) if final else None,
        "final_base": _base_scores(final) if final else None,
        "base_score": base_score, "base_score_from": str(base_eval) if base_eval is not None else ("--base-score" if base_score is not None else None),
        "margin": margin, "threshold": threshold,
        "runs": [{**_run_json(r, threshold), "against_first": against(r, first)} for r in runs],
    }  # fmt: skip


def against(run: RunFigures, first: RunFigures | None) -> dict | None:
    """`run`'s final checkpoint minus `first`'s (the first run with an eval.json), paired prompt by
    prompt: both eval.json files hold the same prompts and seeds (checked by `compare`), so each
    prompt's difference is on identical noise. None for the first run itself, a run without an
    eval.json, or eval.json files written before they held per-prompt scores."""
    from cosmos_rl.evaluation.intervals import paired

    if first is None or run is first or run.final is None:
        return None
    mine, theirs = run.final.get("prompt_scores"), first.final.get("prompt_scores")
    if not mine or not theirs:
        return None
    shapes = {t: len(v) for t, v in mine.items()}, {t: len(v) for t, v in theirs.items()}
    if shapes[0] != shapes[1]:  # the settings agree (checked), so the same prompts: one file is stale or damaged
        raise UserError(f"{run.path / EVAL_DIR / EVAL_RESULT}: \"prompt_scores\" holds {shapes[0]} prompts per task, "
                        f"{first.path / EVAL_DIR / EVAL_RESULT} {shapes[1]} on the same settings; run `cosmos-rl eval` on both again")  # fmt: skip
    intervals = paired(mine, theirs)
    tasks = list(theirs)
    return {
        "against": first.name,
        "change": {"value": run.final["score"] - first.final["score"], "interval": list(intervals.overall)},
        "tasks": {t: {"value": run.final["tasks"][t] - first.final["tasks"][t], "interval": list(intervals.tasks[t])} for t in tasks},
    }  # fmt: skip


def _base_scores(result: dict) -> dict:
    return {"score": result.get("base_score"), "tasks": result.get("base_tasks"), "score_partial": result.get("base_score_partial")}


def _run_json(run: RunFigures, threshold: float | None) -> dict:
    reached = first_reach(run.curve, threshold) if threshold is not None else None
    final = run.final
    return {
        "name": run.name, "path": str(run.path), "algorithm": run.algorithm, "last_step": run.last_step,
        "images": {"per_step": run.budget.per_step, "kind": run.budget.kind, "before_step_1": run.budget.before,
                   "at_last_step": run.budget.at(run.last_step)},
        "wall_s": run.wall_s,
        "curve": [attrs.asdict(p) for p in run.curve],
        "last_eval": attrs.asdict(run.curve[-1]) if run.curve else None,
        "best_eval": attrs.asdict(max(run.curve, key=lambda p: p.score)) if run.curve else None,
        "first_reach": (attrs.asdict(reached) if reached else None) if threshold is not None else None,
        "final": None if final is None else _final_json(final),
        "notes": list(run.notes),
    }  # fmt: skip


def _final_json(result: dict) -> dict:
    """A run's eval.json in the comparison: the overall and per-task score and paired change, each
    with its interval where the file has them (None where it predates them)."""

    def entry(prefix_key: str, interval_key: str, task: str | None) -> dict:
        def pick(key: str):
            value = result.get(key)
            return value.get(task) if task is not None and isinstance(value, dict) else (value if task is None else None)

        return {"value": pick(prefix_key), "interval": pick(interval_key)}

    tasks = list(result.get("tasks") or {})
    return {
        "step": result.get("step"),
        "score": entry("score", "score_interval", None), "change": entry("diff_score", "diff_score_interval", None),
        "base": result.get("base_score"),
        "tasks": {t: {"score": entry("tasks", "tasks_interval", t), "change": entry("diff_tasks", "diff_tasks_interval", t),
                      "base": (result.get("base_tasks") or {}).get(t)} for t in tasks},
    }  # fmt: skip


# -------------------------------------------------------------------------------------- output
