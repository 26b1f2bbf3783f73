"""One rule over every number of the manifest: a float knob must be finite.

TOML reads `inf`, `-inf` and `nan` as floats, and most range rules let them through (`inf >= 0`
holds), so an infinite guidance or learning rate would train or evaluate with exit 0 and write
`Infinity` into JSON. No knob of the specs means anything at infinity or NaN, so this rule adds no
bound of its own beyond finiteness: the spec's values (`rl.beta = 1000`, `rl.kl_beta = 0`, the
+-5 advantage clamp) stay valid.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import attrs

from cosmos_rl.config.preflight.rules import Rules


def non_finite(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every non-finite float in a config tree (attrs tables, lists, dicts)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path, value
    elif attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            yield from non_finite(getattr(value, field.name), f"{path}.{field.name}" if path else field.name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from non_finite(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite(item, f"{path}.{key}")


def finite_rule(config: Any, r: Rules) -> None:
    for path, value in non_finite(config):
        r.error(path, "must be a finite number", value, f"set {path} to a finite value (TOML's inf and nan mean nothing here)")
