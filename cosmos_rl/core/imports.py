"""The one reader of import strings ("module:attr.sub"): the algorithm registry, the suite registry
and condition kinds name code outside the package this way, imported on first use."""

from __future__ import annotations

import importlib
from typing import Any


def load_attr(spec: str) -> Any:
    """The object a "module:attr.sub" import string names (ImportError / AttributeError as raised)."""
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
