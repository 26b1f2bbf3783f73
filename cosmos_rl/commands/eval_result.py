"""The schema of an `eval.json` read back (`compare`'s runs and `--base-eval`, `report`'s evaluation
section): a file on disk is untrusted, so every field a reader uses is checked here once, by type
and by the range its number can take, before anything adds, plots or writes it. One line names
the file, the field, what was found and the fix (UserError).

Ranges: a score is the mean of per-image scores of its reward, so it lies in the reward's
`evaluation.scores.score_range` (a suite's verifier: [0, 1]); a partial score in [0, 1]; a change
(`diff_*`, the checkpoint minus its base) in [lo - hi, hi - lo]; an interval [a, b] has a <= b
inside its value's range. Every number is finite and not a bool (`true` is not a score). The tasks
of every per-task object are the tasks of `tasks`; the per-prompt lists (`prompt_scores`...) hold
`n_prompts` numbers in all. The whole document is at most MAX_DEPTH deep (eval.json is 3 deep), so
nothing nested deeper reaches a recursive comparison or `json.dumps`.

Torch-free; reading the reward's range imports nothing a file names."""

from __future__ import annotations

import json
import math
from pathlib import Path

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import read_user_text
from cosmos_rl.evaluation.scores import UNIT, score_range

MAX_DEPTH = 8
MAX_BYTES = 64 * 1024 * 1024  # eval.json of the whole 319-prompt held-out set is ~100 kB
_PARTS = ("", "_partial")
_PREFIXES = ("", "base_", "diff_")
_SLACK = 1e-9  # a bootstrap bound is a mean of in-range numbers, a rounding error at most past the range


class _Bad(Exception):
    """One problem: `field` and what is wrong with it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")


def _shown(value, limit: int = 60) -> str:
    text = ascii(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _depth(value) -> int:
    """The nesting depth of a JSON value, without recursion (a deep document cannot overflow it)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _number(field: str, value, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(field, f"{_shown(value)} is not a number")
    if not math.isfinite(value) or not lo - _SLACK <= value <= hi + _SLACK:
        raise _Bad(field, f"{_shown(value)} is outside [{lo:g}, {hi:g}], the range this score can take")
    return float(value)


def _interval(field: str, value, lo: float, hi: float) -> None:
    if not isinstance(value, list) or len(value) != 2:
        raise _Bad(field, f"{_shown(value)} is not an interval [lo, hi]")
    a, b = (_number(f"{field}[{i}]", v, lo, hi) for i, v in enumerate(value))
    if a > b:
        raise _Bad(field, f"[{a:g}, {b:g}] has lo > hi")


def _per_task(field: str, value, tasks: list[str]) -> dict:
    if not isinstance(value, dict):
        raise _Bad(field, f"{_shown(value)} is not an object of tasks")
    if sorted(value) != sorted(tasks):
        raise _Bad(field, f"holds the tasks {sorted(value)}, \"tasks\" holds {sorted(tasks)}")
    return value


def _check(result, reward_range: tuple[float, float], tasks_needed: bool) -> None:
    if not isinstance(result, dict):
        raise _Bad("(top level)", f"{_shown(result)} is not an object")
    if _depth(result) > MAX_DEPTH:
        raise _Bad("(top level)", f"nested deeper than {MAX_DEPTH} levels; eval.json is 3 deep")
    for key in ("kind", "target", "reward", "prompts"):  # compared and printed; older files may lack one
        if result.get(key) is not None and not isinstance(result.get(key), str):
            raise _Bad(key, f"{_shown(result.get(key))} is not a string")
    step = result.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise _Bad("step", f"{_shown(step)} is not a step (a count, or null for a model)")
    n_prompts = result.get("n_prompts")
    if n_prompts is not None and (isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1):
        raise _Bad("n_prompts", f"{_shown(n_prompts)} is not a count of prompts")
    tasks = result.get("tasks")
    if tasks is None and not tasks_needed:
        tasks = {}
    elif not isinstance(tasks, dict) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise _Bad("tasks", f"{_shown(tasks)} is not a non-empty object of task scores")
    names = list(tasks)
    lo, hi = reward_range
    for prefix in _PREFIXES:
        for part in _PARTS:
            low, high = (lo, hi) if not part else UNIT
            if prefix == "diff_":
                low, high = low - high, high - low
            score_key, tasks_key = f"{prefix}score{part}", f"{prefix}tasks{part}"
            required = prefix == "" and part == ""
            if not names and result.get(tasks_key) is not None:
                raise _Bad(tasks_key, "given without \"tasks\"")
            if result.get(score_key) is not None or required:
                _number(score_key, result.get(score_key), low, high)
            if result.get(tasks_key) is not None or (required and tasks_needed):
                for task, value in _per_task(tasks_key, result.get(tasks_key), names).items():
                    _number(f"{tasks_key}.{task}", value, low, high)
            if result.get(f"{score_key}_interval") is not None:
                _interval(f"{score_key}_interval", result[f"{score_key}_interval"], low, high)
            if result.get(f"{tasks_key}_interval") is not None:
                for task, value in _per_task(f"{tasks_key}_interval", result[f"{tasks_key}_interval"], names).items():
                    _interval(f"{tasks_key}_interval.{task}", value, low, high)
    for prefix in ("", "base_"):
        for key, (low, high) in ((f"{prefix}prompt_scores", (lo, hi)), (f"{prefix}prompt_partials", UNIT)):
            if result.get(key) is None:
                continue
            count = 0
            for task, values in _per_task(key, result[key], names).items():
                if not isinstance(values, list) or not values:
                    raise _Bad(f"{key}.{task}", f"{_shown(values)} is not a non-empty list of prompt scores")
                for i, value in enumerate(values):
                    _number(f"{key}.{task}[{i}]", value, low, high)
                count += len(values)
            if n_prompts is not None and count != n_prompts:
                raise _Bad(key, f"holds {count} prompts' scores, \"n_prompts\" is {n_prompts}")


def checked(result, where: str, tasks_needed: bool = True) -> dict:
    """`result` (an eval.json's parsed content) when it is what `cosmos-rl eval` writes; else a
    UserError naming `where` (the file, or the option and file) and the field. `tasks_needed`
    False: a reader of the overall score alone (`compare --base-eval`) takes a file without "tasks"."""
    reward = result.get("reward") if isinstance(result, dict) else None
    try:
        _check(result, score_range(reward) if isinstance(reward, str) else UNIT, tasks_needed)
    except _Bad as bad:
        raise UserError(f"{where}: not what `cosmos-rl eval` writes ({bad}); run `cosmos-rl eval` again, or delete the file") from None
    return result


def read(path: Path, where: str, tasks_needed: bool = True, origin: str = "") -> dict:
    """The eval.json at `path`, read through `core.files` (a regular file of at most MAX_BYTES, so a
    FIFO or /dev/zero cannot block or balloon it), parsed refusing NaN/Infinity, and `checked`.
    `where` names the file in messages; `origin` (the option that named it) prefixes the read's."""
    text = read_user_text(path, origin, "eval.json", MAX_BYTES)
    try:
        result = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deeply to read; pass the eval.json `cosmos-rl eval` wrote") from None
    except ValueError as exc:
        raise UserError(f"{where}: not readable as JSON ({_shown(str(exc), 120)}); pass the eval.json `cosmos-rl eval` wrote") from None
    return checked(result, where, tasks_needed)


def _no_constant(name: str):
    """json.loads reads NaN/Infinity by default; eval.json never holds them (written allow_nan=False)."""
    raise ValueError(f"{name} is not a JSON number")
