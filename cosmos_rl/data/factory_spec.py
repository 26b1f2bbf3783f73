"""Resolving a `module:function` factory spec, and asking it about `membership_ids`, by importing only.

Torch-free so that preflight (which must not import torch) and the data layer share one resolver:
the spec `validate` accepts is exactly the spec a run can build.
"""

from __future__ import annotations

import importlib
import typing
from typing import Any, Callable

from cosmos_rl.core.errors import UserError


class FactorySpecError(UserError):
    """Why a factory spec does not resolve; `kind` is one of format, not_found, import_failed,
    no_attribute, not_callable, so a caller can word it for its own context."""

    def __init__(self, kind: str, message: str, module: str = "", attr: str = "", cause: BaseException | None = None):
        super().__init__(message)
        self.kind, self.module, self.attr, self.cause = kind, module, attr, cause


def resolve_factory(spec: str, what: str = "rl.data.factory") -> Callable[..., Any]:
    """`module:function` or `module:Class.attr` -> the callable; `what` names the key in errors."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path or ":" in attr_path:
        raise FactorySpecError("format", f"{what}: {spec!r} is not of the form 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise FactorySpecError(
                "not_found", f"{what}: module {module_name!r} not found; install it or add its folder to PYTHONPATH",
                module_name, cause=exc,
            ) from exc
        raise FactorySpecError("import_failed", f"{what}: importing {module_name!r} failed: {exc}", module_name, cause=exc) from exc
    except Exception as exc:  # the user's module raised while importing; show why
        raise FactorySpecError(
            "import_failed", f"{what}: importing {module_name!r} failed: {type(exc).__name__}: {exc}", module_name, cause=exc
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise FactorySpecError(
                "no_attribute", f"{what}: {spec!r}: {module_name!r} has no attribute {attr_path!r}", module_name, attr_path
            )
        target = getattr(target, part)
    if not callable(target):
        raise FactorySpecError(
            "not_callable", f"{what}: {spec!r} is a {type(target).__name__}, not a function or class", module_name, attr_path
        )
    return target


def exposes_membership(target: Callable[..., Any]) -> bool:
    """Whether a resolved factory's source type defines `membership_ids`: a class that defines it,
    or a function whose return annotation is such a class."""
    if isinstance(target, type):
        return callable(getattr(target, "membership_ids", None))
    try:
        returned = typing.get_type_hints(target).get("return")
    except Exception:  # unresolvable annotations tell us nothing either way
        return False
    return isinstance(returned, type) and callable(getattr(returned, "membership_ids", None))
