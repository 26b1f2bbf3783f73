"""The closing summary `train` and `resume` print when a run ends well: how far it got and how long
it took, its final metrics, where its run directory and newest checkpoint are, and the commands to
run next (eval, report, export, resume), one plain line each so a log (`nohup ... > log`) reads it.

Read from the run directory's files alone (`metrics.jsonl`, `checkpoints/`), as `report` reads them,
so it says what the run wrote, whichever backend trained it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from cosmos_rl.checkpoint import layout

# Per-task breakdowns and interval bounds stay in metrics.jsonl and the report: a summary line
# carries the headline numbers.
_LEFT_OUT = ("time/", "eval/task/", "eval/task_partial/")
_BOUNDS = ("_lo", "_hi")


def final_metrics(run_dir: Path) -> tuple[int | None, dict[str, tuple[int, float]]]:
    """(the last logged step, {metric: (its step, its value)}): each headline metric's newest value,
    so an `eval/` or `val/` score logged on an earlier row than the last is kept with its step."""
    path = Path(run_dir) / "metrics.jsonl"
    latest: dict[str, tuple[int, float]] = {}
    last_step = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None, {}
    for line in lines:
        try:
            row = json.loads(line)
            step = int(row.pop("step"))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue  # a torn row: the summary shows what reads; `report` names a damaged file
        last_step = step
        for key, value in row.items():
            if key.startswith(_LEFT_OUT) or key.endswith(_BOUNDS) or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            latest[key] = (step, float(value))
    return last_step, latest


def clock(seconds: float) -> str:
    whole = int(round(max(seconds, 0.0)))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def lines(run_dir: Path, max_steps: int, seconds: float, first_step: int | None, *, nothing_left: bool = False) -> list[str]:
    """The summary's lines. `first_step`: the step this call started after (0: a new run);
    `nothing_left`: a resume that found every step done and trained nothing."""
    run_dir = Path(run_dir).resolve()
    committed = layout.committed_steps(layout.checkpoints_root(run_dir))
    done = committed[-1] if committed else None
    logged, metrics = final_metrics(run_dir)
    if nothing_left:
        head = f"nothing left to do: {run_dir} has done all {max_steps} steps (checkpoint step_{done} is committed and intact)"
    else:
        resumed = f" (resumed after step {first_step})" if first_step else ""
        head = f"done: {max_steps} of {max_steps} steps in {clock(seconds)}{resumed}"
    out = [head]
    if metrics:
        shown = sorted(metrics, key=lambda k: (not k.startswith("eval/"), not k.startswith("val/"), k))
        text = "  ".join(f"{k} {v:.4g}" + (f" (step {s})" if s != logged else "") for k, (s, v) in ((k, metrics[k]) for k in shown))
        out.append(f"  final metrics (step {logged}): {text}")
    out.append(f"  run dir:     {run_dir}")
    out.append(f"  metrics:     {run_dir / 'metrics.jsonl'}")
    out.append(f"  checkpoint:  {layout.checkpoints_root(run_dir) / f'step_{done}'}" if done is not None else "  checkpoint:  none committed")
    quoted = shlex.quote(str(run_dir))
    out.append("  next:")
    out.append(f"    cosmos-rl eval {quoted}    # score the checkpoint against its base on held-out prompts")
    out.append(f"    cosmos-rl report {quoted}    # plots and report.md of the metrics, in {run_dir / 'report'}")
    out.append(f"    cosmos-rl export {quoted} --out {shlex.quote(f'models/{run_dir.name}')}    # the model as a diffusers folder")
    out.append(f"    cosmos-rl resume {quoted} rl.max_steps={2 * max_steps}    # train further")
    return out
