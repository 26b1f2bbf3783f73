"""Manifest TOML + KEY=VALUE overrides -> a typed ``RunConfig`` through one strict cattrs converter.

Every structural problem (unknown key, wrong type, unknown option, missing key) is collected in one
pass and raised as a ``ManifestError``; nothing is coerced ("5" is not an int, "false" is not a
bool) and nothing is dropped.
"""

from __future__ import annotations

import copy
import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal, Union

import attrs
import cattrs
import tomli_w
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.gen import make_dict_structure_fn

from cosmos_rl.config import algorithms, key_hints, legacy_keys, preflight
from cosmos_rl.config.preflight.numbers import non_finite
from cosmos_rl.config.saved_runs import with_later_knobs
from cosmos_rl.core import schema
from cosmos_rl.core.files import name_problem, shown
from cosmos_rl.core.paths import resolve_path
from cosmos_rl.core.problems import ManifestError, Problem, show


class _BadValue(Exception):
    """Raised by the strict hooks; the walker turns it into a Problem at the current path."""

    def __init__(self, problem: str, got: object, fix: str):
        super().__init__(problem)
        self.problem, self.got, self.fix = problem, got, fix


class _Nested(Exception):
    """Problems found below the current path, keyed by the relative key or index."""

    def __init__(self, items: list[tuple[str, BaseException]]):
        super().__init__("nested problems")
        self.items = items


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _strict(kind: type):
    def hook(value, _type):
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise _BadValue(f"expected {_TYPE_NAMES[kind]}", value, f"write {_TYPE_NAMES[kind]}")
        if kind is str and name_problem(value) is not None:
            # No key takes a NUL byte or a lone surrogate (TOML allows both as escapes): as a path
            # it would pass `validate` and make the run's first open() raise (a traceback).
            raise _BadValue(f"the string {name_problem(value)}", shown(value), "remove it")
        return value

    return hook


def _literal_hook(value, type_):
    options = typing.get_args(type_)
    if value not in options or isinstance(value, bool):
        listed = ", ".join(show(o) for o in options)
        close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
        hint = f'did you mean "{close[0]}"? ' if close else ""
        raise _BadValue("unknown option", value, f"{hint}use one of {listed}")
    return value


def _make_list_hook(converter: cattrs.Converter):
    def hook(value, type_):
        if not isinstance(value, list):
            raise _BadValue("expected a list", value, "write a TOML array, e.g. [...]")
        (item_type,) = typing.get_args(type_) or (Any,)
        out, bad = [], []
        for i, item in enumerate(value):
            try:
                out.append(converter.structure(item, item_type))
            except Exception as exc:  # collected, reported with the index
                bad.append((f"[{i}]", exc))
        if bad:
            raise _Nested(bad)
        return out

    return hook


def _make_dict_hook(converter: cattrs.Converter):
    def hook(value, type_):
        if not isinstance(value, dict):
            raise _BadValue("expected a table", value, "write a TOML table, e.g. {key = ...}")
        key_type, value_type = typing.get_args(type_) or (str, Any)
        out, bad = {}, []
        for key, item in value.items():
            try:
                out[key] = converter.structure(item, value_type)
            except Exception as exc:
                bad.append((f".{key}", exc))
        if bad:
            raise _Nested(bad)
        return out

    return hook


def _scalar_union_hook(value, type_):
    kinds = typing.get_args(type_)
    if isinstance(value, kinds):
        return value
    raise _BadValue("expected a string, number or boolean", value, "write a plain TOML value")


def _rl_hook(converter: cattrs.Converter):
    def hook(value, _type):
        if not isinstance(value, dict):
            raise _BadValue("expected a table", value, "write an [rl] table")
        algorithm = value.get("algorithm")
        options = ", ".join(show(a) for a in algorithms.BUILT_IN)
        if algorithm is None:
            raise _Nested([(".algorithm", _BadValue("required key missing", _MISSING, f"set it to one of {options}"))])
        if not isinstance(algorithm, str):  # a list or table cannot even be looked up
            raise _Nested([(".algorithm", _BadValue("expected a string naming the algorithm", algorithm, f"use one of {options}"))])
        try:
            entry = algorithms.get(algorithm)
        except algorithms.UnknownAlgorithm as exc:
            if ":" not in algorithm:
                raise _Nested([(".algorithm", _BadValue("unknown algorithm", algorithm, f"use one of {options}"))]) from None
            raise _Nested([(".algorithm", _BadValue(str(exc), algorithm, "name a module:attribute holding an algorithms.Algorithm entry"))]) from None
        return converter.structure(value, entry.config)

    return hook


_MISSING = object()


def _make_table_hook_factory(converter: cattrs.Converter):
    def factory(cls):
        inner = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True, _cattrs_detailed_validation=True)

        def hook(value, type_):
            if not isinstance(value, dict):
                raise _BadValue("expected a table", value, "write a TOML table")
            return inner(value, type_)

        return hook

    return factory


def make_converter() -> cattrs.Converter:
    """The project's one converter: strict scalars, forbidden extra keys, tagged `rl` union."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for kind in (int, float, str, bool):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is Literal, _literal_hook)
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _make_list_hook(conv))
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is dict, _make_dict_hook(conv))
    conv.register_structure_hook(Union[str, int, float, bool], _scalar_union_hook)
    conv.register_structure_hook_factory(attrs.has, _make_table_hook_factory(conv))
    # By identity, not by class: singledispatch would also send every algorithm's own class here.
    conv.register_structure_hook_func(lambda t: t is schema.RLBase, _rl_hook(conv))
    # Written out as what it is (the algorithm's own class), not as the base's shared fields.
    conv.register_unstructure_hook_func(lambda t: t is schema.RLBase, lambda rl: conv.unstructure(rl, unstructure_as=type(rl)))
    return conv


CONVERTER = make_converter()


# ------------------------------------------------------------------------------ error collection
def _note_key(exc: BaseException) -> str | None:
    for note in getattr(exc, "__notes__", []):
        if hasattr(note, "name"):
            return f".{note.name}"
        if hasattr(note, "index"):
            return f"[{note.index}]"
    return None


def _join(path: str, key: str) -> str:
    return (path + key).lstrip(".")


def _collect(exc: BaseException, path: str, out: list[Problem]) -> None:
    if isinstance(exc, ForbiddenExtraKeysError):
        prefix = path.lstrip(".") + "." if path else ""
        for key in sorted(exc.extra_fields):
            out.append(Problem(_join(path, "." + key), "unknown key", fix=key_hints.did_you_mean(prefix, key, exc.cl)))
    elif isinstance(exc, (ClassValidationError, IterableValidationError)):
        for sub in exc.exceptions:
            key = _note_key(sub)
            _collect(sub, path + key if key else path, out)
    elif isinstance(exc, _Nested):
        for key, sub in exc.items:
            _collect(sub, path + key, out)
    elif isinstance(exc, _BadValue):
        if exc.got is _MISSING:
            out.append(Problem(_join(path, ""), exc.problem, fix=exc.fix))
        else:
            out.append(Problem(_join(path, ""), exc.problem, exc.got, exc.fix))
    elif isinstance(exc, KeyError):
        out.append(Problem(_join(path, ""), "required key missing", fix="add it to the manifest"))
    else:
        out.append(Problem(_join(path, ""), f"invalid value: {exc}", fix="see docs/manifest.md"))


def structure(raw: dict, source: str = "") -> schema.RunConfig:
    """Raw TOML data -> RunConfig, or a ManifestError listing every structural problem."""
    if "rl" not in raw:
        algos = " or ".join(show(a) for a in algorithms.BUILT_IN)
        problems = [Problem("rl.algorithm", "required key missing", fix=f"add [rl] with algorithm = {algos}")]
        try:
            CONVERTER.structure({**raw, "rl": {"algorithm": "dpo"}}, schema.RunConfig)
        except Exception as exc:
            _collect(exc, "", problems)
        raise ManifestError(problems, source)
    try:
        return CONVERTER.structure(raw, schema.RunConfig)
    except Exception as exc:
        problems: list[Problem] = []
        _collect(exc, "", problems)
        raise ManifestError(problems, source) from None


# ------------------------------------------------------------------------------------ overrides
def parse_override(item: str) -> tuple[str, Any]:
    """`rl.max_steps=5` -> ("rl.max_steps", 5); values are TOML values."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ManifestError([Problem(f"override {item!r}", "not a KEY=VALUE item", fix="write e.g. rl.max_steps=5")])
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        raise ManifestError(
            [Problem(key, "override value is not a TOML value", text, fix=key_hints.override_fix(key, text))]
        ) from None
    return key, value


def apply_overrides(raw: dict, items: list[str]) -> dict:
    """Return a copy of ``raw`` with every override applied; all bad items are reported together."""
    out = copy.deepcopy(raw)
    problems: list[Problem] = []
    for item in items:
        try:
            key, value = parse_override(item)
        except ManifestError as exc:
            problems.extend(exc.problems)
            continue
        parts = key.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                problems.append(
                    Problem(".".join(parts[: i + 1]), "is a value, not a table", nxt, fix=f"override {'.'.join(parts[: i + 1])} itself")
                )
                break
            node = nxt
        else:
            node[parts[-1]] = value
    if problems:
        raise ManifestError(problems, "overrides")
    return out


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ManifestError([Problem(str(path), "manifest file not found", fix="pass the path of a .toml manifest")])
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError([Problem(str(path), "not valid TOML", fix=str(exc))]) from None
    except UnicodeDecodeError:
        raise ManifestError([Problem(str(path), "not UTF-8 text", fix="save the manifest as UTF-8 TOML")]) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ManifestError([Problem(str(path), "nested too deeply to read", fix=f"no manifest value nests deeper than {MAX_DEPTH} levels; fix the file")]) from None
    if _depth(raw) > MAX_DEPTH:
        # Shallow enough for tomllib, but the copies and checks after it recurse too.
        raise ManifestError([Problem(str(path), f"nests values more than {MAX_DEPTH} levels deep", fix="no manifest key is nested that deep; fix the file")])
    return raw


# The deepest a manifest goes is a table of an array of tables of a table (rl.rewards[0].x); a file
# nested far deeper is damaged or hostile, and would exhaust Python's recursion in deepcopy or cattrs.
MAX_DEPTH = 32


def _depth(value) -> int:
    """How deeply tables and arrays nest in a parsed TOML value (iterative: the value may be deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


def _current_keys(raw: dict, saved_run: bool) -> dict:
    """`raw` with keys a release replaced moved to their new place (config/legacy_keys.py); a
    user's manifest says so once, a run directory's saved manifest quietly."""
    raw, notes = legacy_keys.migrate(raw)
    if not saved_run:
        legacy_keys.note_once(notes)
    return raw


def load(path: str | Path, overrides: list[str] = (), *, saved_run: bool = False) -> schema.RunConfig:
    """Load a manifest; `saved_run` = it is a run directory's resolved manifest.toml (see with_later_knobs)."""
    raw = read_manifest(path)
    raw = _current_keys(apply_overrides(with_later_knobs(raw) if saved_run else raw, list(overrides)), saved_run)
    config = structure(raw, str(path))
    if saved_run:
        # eval, export and pairs mine read a run's saved manifest without the whole preflight (it
        # ran when the run started); a hand-edited inf or nan would still reach the sampler and
        # the JSON it writes, so that one rule is asked again here.
        bad = [Problem(key, "must be a finite number", value, f"set {key} to a finite value") for key, value in non_finite(config)]
        if bad:
            raise ManifestError(bad, str(path))
    return config


# ---------------------------------------------------------------------------------- unstructure
def to_dict(config: schema.RunConfig) -> dict:
    """Plain nested dict of the resolved config, None values left out (TOML has no null)."""

    def prune(value):
        if isinstance(value, dict):
            return {k: prune(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [prune(v) for v in value]
        return value

    return prune(CONVERTER.unstructure(config))


def to_toml(config: schema.RunConfig) -> str:
    return tomli_w.dumps(to_dict(config))


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """{"rl": {"beta": 1}} -> {"rl.beta": 1}; lists and leaf dicts of scalars stay values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and _is_section(path):
            out.update(flatten(value, path + "."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and _is_section(path):
            for i, item in enumerate(value):  # an array of tables, e.g. [[rl.rewards]]: rl.rewards[0].name
                out.update(flatten(item, f"{path}[{i}]."))
        else:
            out[path] = value
    return out


def _is_section(path: str) -> bool:
    # Sections are the paths whose schema type is an attrs class; user dict fields (shapes,...) are leaves.
    return any(p.startswith(path + ".") for p in key_hints.every_path())


def with_absolute_paths(config: schema.RunConfig, base_dir: Path | str) -> schema.RunConfig:
    """Manifest paths are relative to the manifest's folder; pin them so the run dir's copy is portable."""
    base = Path(base_dir)

    pin = lambda value: resolve_path(value, base)  # noqa: E731
    rl = attrs.evolve(config.rl, init_from=pin(config.rl.init_from))
    rl = attrs.evolve(rl, eval=attrs.evolve(rl.eval, prompts=pin(rl.eval.prompts)))
    rl = algorithms.with_paths(algorithms.of(config), rl, pin)
    model = attrs.evolve(config.model, path=resolve_path(config.model.path, base))
    return attrs.evolve(config, rl=rl, model=model)


def _drop(raw: dict, path: str) -> bool:
    """Delete the value at a problem's path (a list index drops the whole list); False if absent."""
    keys = path.split("[", 1)[0].split(".")
    node = raw
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return False
    if isinstance(node, dict) and keys[-1] in node:
        del node[keys[-1]]
        return True
    return False


def load_all_problems(
    path: str | Path, overrides: list[str] = (), *, saved_run: bool = False
) -> tuple[schema.RunConfig | None, list[Problem]]:
    """Load and preflight in one pass, reporting every problem at once.

    When the manifest has structural problems (wrong types, unknown keys), those values are set
    aside and the rest is still checked against the preflight rules, so one run of `validate`
    shows everything. Returns the config only when there is no structural problem.
    """
    raw = read_manifest(path)
    raw = _current_keys(apply_overrides(with_later_knobs(raw) if saved_run else raw, list(overrides)), saved_run)
    base_dir = Path(path).resolve().parent
    try:
        config = structure(raw, str(path))
    except ManifestError as exc:
        problems = list(exc.problems)
        repaired = copy.deepcopy(raw)
        if all(_drop(repaired, p.path) for p in problems):
            try:
                partial = structure(repaired, str(path))
            except ManifestError:
                return None, problems
            reported = {p.path for p in problems}
            problems += [p for p in preflight.check(partial, base_dir) if p.path not in reported]
        return None, problems
    return config, preflight.check(config, base_dir)
