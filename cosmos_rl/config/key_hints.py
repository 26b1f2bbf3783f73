"""Hints for a manifest key the schema does not have: the key of the other algorithm's `rl`
table, a close spelling among its siblings, the same name elsewhere in the schema, or what the
table takes (`load` attaches one to every "unknown key" problem)."""

from __future__ import annotations

import difflib
import functools
import typing

import attrs

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.core.problems import show


def all_paths(cls: type, prefix: str = "") -> list[str]:
    paths = []
    for f in attrs.fields(cls):
        path = f"{prefix}{f.name}"
        paths.append(path)
        inner = [t for t in (typing.get_args(f.type) or (f.type,)) if attrs.has(t)]
        for t in inner:
            paths.extend(all_paths(t, path + "."))
    return paths


def every_path() -> list[str]:
    """Every manifest path of the schema and of every registered algorithm's `rl` table."""
    return _paths_of(tuple(algorithms.get(name).config for name in algorithms.names()))


@functools.lru_cache(maxsize=8)
def _paths_of(classes: tuple[type, ...]) -> list[str]:
    return sorted(set(all_paths(schema.RunConfig)).union(*(all_paths(cls, "rl.") for cls in classes)))


def _other_algorithm(path: str, cls: type) -> str | None:
    """The algorithm whose `rl` table declares `path` when the manifest's own (`cls`) does not."""
    named = {name: algorithms.get(name).config for name in algorithms.names()}
    mine = next((name for name, c in named.items() if c is cls), None)
    if mine is None or path in all_paths(cls, "rl."):
        return None
    return next((name for name, c in named.items() if path in all_paths(c, "rl.")), None)


def did_you_mean(parent_path: str, key: str, cls: type) -> str:
    other = _other_algorithm(parent_path + key, cls)
    if other is not None:
        mine = next(name for name in algorithms.names() if algorithms.get(name).config is cls)
        return (f"{parent_path}{key} belongs to {other.upper()}, and this manifest runs {mine.upper()}; "
                f"remove it, or set rl.algorithm = {show(other)}")
    siblings = [f.name for f in attrs.fields(cls)]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
    if close:
        return f"did you mean {parent_path}{close[0]}?"
    elsewhere = [p for p in every_path() if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"did you mean {elsewhere[0]}?"
    return f"remove it; {parent_path.rstrip('.') or 'the top level'} takes: {', '.join(siblings)}"


# ------------------------------------------------------------------------ override value hints
def _leaf_types(tp) -> list:
    """The types a value of annotation `tp` may take: Optional/Union unwrapped, a list left whole."""
    if typing.get_origin(tp) is typing.Union:
        return [t for arg in typing.get_args(tp) if arg is not type(None) for t in _leaf_types(arg)]
    return [tp]


def field_types(path: str) -> list:
    """The declared types of the dotted manifest `path` (`rl.*` in every algorithm's table, list
    indices such as `rl.rewards[1]` ignored); empty when no table declares it."""
    import re

    parts = re.sub(r"\[\d+\]", "", path).split(".")
    roots = [schema.RunConfig]
    if parts[0] == "rl" and len(parts) > 1:
        roots, parts = [algorithms.get(name).config for name in algorithms.names()], parts[1:]
    found = []
    for root in roots:
        current = [root]
        for i, part in enumerate(parts):
            nxt = []
            for cls in current:
                fields = {f.name: f for f in attrs.fields(cls)} if attrs.has(cls) else {}
                if part not in fields:
                    continue
                for tp in _leaf_types(fields[part].type):
                    item = typing.get_args(tp)[0] if typing.get_origin(tp) is list and typing.get_args(tp) else tp
                    nxt.append(item if i < len(parts) - 1 and attrs.has(item) else tp)
            current = nxt
        found.extend(current)
    return found


def override_fix(key: str, text: str) -> str:
    """The fix for `KEY=TEXT` whose TEXT is no TOML value, written as a shell passes it on: for a
    string key the TOML string inside shell quotes (bash turns `job.name="x"` back into
    `job.name=x`); for a bool key `true`/`false`; for a number key a number; for an option its
    choices; for a list of strings a TOML array."""
    import json
    import shlex

    def shell(value: str) -> str:
        # json.dumps writes a TOML basic string: the same quotes and backslash escapes
        return shlex.quote(f"{key}={value}")

    kinds = field_types(key)
    if kinds and all(k is bool for k in kinds):
        return f"write true or false: {key}=true or {key}=false"
    if kinds and all(k is int for k in kinds):
        return f"write an integer, e.g. {key}=10"
    if kinds and all(k in (int, float) for k in kinds):
        return f"write a number, e.g. {key}=0.5 or {key}=1e-4"
    if kinds and all(typing.get_origin(k) is typing.Literal for k in kinds):
        options = list(dict.fromkeys(a for k in kinds for a in typing.get_args(k)))
        picked = [text] if text in options else options
        listed = " or ".join(shell(json.dumps(a)) for a in picked)
        return f"write {listed} (the TOML quotes inside shell quotes)"
    if kinds and all(typing.get_origin(k) is list for k in kinds):
        return f"write a TOML array inside shell quotes: {shell(json.dumps([text], ensure_ascii=False))}"
    return f"quote strings, with shell quotes around the TOML quotes: {shell(json.dumps(text, ensure_ascii=False))}"
