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
