"""A run directory's saved manifest.toml read back as the run was: knobs added after it was written
take the value that reproduces what the run computed then (schema.LATER_KNOB_DEFAULTS), not
today's default."""

from __future__ import annotations

import copy

import attrs

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema


def with_later_knobs(raw: dict) -> dict:
    """A run directory's saved manifest written before some knob existed: give that knob the value
    that reproduces what the run computed then (schema.LATER_KNOB_DEFAULTS), not today's default."""
    raw = copy.deepcopy(raw)
    algorithm = raw.get("rl", {}).get("algorithm") if isinstance(raw.get("rl"), dict) else None
    for key, value in schema.LATER_KNOB_DEFAULTS.items():
        parts = key.split(".")
        node = raw
        for part in parts[:-1]:
            # Walk only the tables the manifest has: an empty `rl.reward` made up for a later
            # `rl.reward.*` knob would be an unknown table to a run of another algorithm.
            node = node.get(part)
            if not isinstance(node, dict):
                break
        else:
            if parts[-1] not in node and _knob_applies(algorithm, key):
                node[parts[-1]] = copy.deepcopy(value)
    return raw


def _knob_applies(algorithm, key: str) -> bool:
    if not isinstance(algorithm, str) or not key.startswith("rl.") or key.count(".") != 1:
        return False
    try:
        rl_class = algorithms.get(algorithm).config
    except algorithms.UnknownAlgorithm:  # the loader reports it, with the options
        return False
    return key.split(".")[1] in {f.name for f in attrs.fields(rl_class)}
