"""Custom pair sources named by ``rl.data.factory = "module:function"``.

The function (or class) is called with keyword arguments and must return an object
with ``__len__`` and ``__getitem__(i) -> PreferencePair``. Train-time validation also
needs a metadata-only ``membership_ids()``; preflight asks
:func:`factory_exposes_membership` without building the source, which it can answer
only from what importing reveals: a class target that defines ``membership_ids``, or a
function whose return annotation is such a class.
"""

from __future__ import annotations

import importlib
import typing
from typing import Any, Callable

from cosmos_rl.data.pair_record import PreferencePair, PromptSides, check_pair
from cosmos_rl.errors import UserError

_WHAT = "rl.data.factory"


def _resolve(spec: str) -> Callable[..., Any]:
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path or ":" in attr_path:
        raise UserError(f"{_WHAT}: {spec!r} is not of the form 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UserError(
                f"{_WHAT}: module {module_name!r} not found; install it or add its folder to PYTHONPATH"
            ) from exc
        raise UserError(f"{_WHAT}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # the user's module raised while importing; show why
        raise UserError(f"{_WHAT}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise UserError(f"{_WHAT}: {spec!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UserError(f"{_WHAT}: {spec!r} is a {type(target).__name__}, not a function or class")
    return target


def factory_exposes_membership(spec: str) -> bool:
    """Whether the factory's source type defines ``membership_ids``, by importing only."""
    target = _resolve(spec)
    if isinstance(target, type):
        return callable(getattr(target, "membership_ids", None))
    try:
        returned = typing.get_type_hints(target).get("return")
    except Exception:  # unresolvable annotations tell us nothing either way
        return False
    return isinstance(returned, type) and callable(getattr(returned, "membership_ids", None))


class CheckedFactorySource:
    """Wraps a factory's source so that a malformed record fails naming the factory and index."""

    def __init__(self, source: Any, spec: str):
        self._source = source
        self.spec = spec

    def __len__(self) -> int:
        length = len(self._source)
        if length <= 0:
            raise UserError(f"{_WHAT}: {self.spec!r} returned an empty source")
        return length

    def __getitem__(self, index: int) -> PreferencePair:
        return check_pair(self._source[index], f"{_WHAT} {self.spec!r} index {index}")

    def membership_ids(self) -> list[str]:
        hook = getattr(self._source, "membership_ids", None)
        if hook is None:
            raise UserError(
                f"{_WHAT}: {self.spec!r} returned {type(self._source).__name__} without membership_ids(); "
                "validation needs it to audit train/val overlap - add a method returning every pair id "
                "from metadata (without decoding images)"
            )
        ids = hook()
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise UserError(f"{_WHAT}: {self.spec!r}: membership_ids() must return a list of str")
        return ids

    def prompt_sides(self) -> list[PromptSides]:
        """The source's own per-side prompts; a source without them has one prompt per pair."""
        hook = getattr(self._source, "prompt_sides", None)
        return list(hook()) if hook is not None else []


def factory_source(spec: str, **kwargs: Any) -> CheckedFactorySource:
    """Import ``module:function``, call it with ``kwargs``, and check what it returns."""
    source = _resolve(spec)(**kwargs)
    missing = [name for name in ("__len__", "__getitem__") if not hasattr(source, name)]
    if missing:
        raise UserError(
            f"{_WHAT}: {spec!r} returned {type(source).__name__}, which lacks {', '.join(missing)}; "
            "a pair source needs __len__ and __getitem__(i) -> PreferencePair"
        )
    return CheckedFactorySource(source, spec)
