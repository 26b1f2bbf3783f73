"""Custom pair sources named by ``rl.data.factory = "module:function"``.

The function (or class) is called with keyword arguments and must return an object
with ``__len__`` and ``__getitem__(i) -> PreferencePair``. Train-time validation also
needs a metadata-only ``membership_ids()``; preflight asks ``factory_spec.exposes_membership``
without building the source, which it can answer only from what importing reveals: a class
target that defines ``membership_ids``, or a function whose return annotation is such a class.
"""

from __future__ import annotations

from typing import Any

from cosmos_rl.data.factory_spec import resolve_factory
from cosmos_rl.data.pair_record import PreferencePair, PromptSides, check_pair
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec

_WHAT = "rl.data.factory"


class CheckedFactorySource:
    """Wraps a factory's source so that a malformed record fails naming the factory and index
    (`media`: the run's; at `media.frames` > 1 every side must be a clip of exactly that many frames)."""

    def __init__(self, source: Any, spec: str, media: MediaSpec):
        self._source = source
        self.spec = spec
        self.media = media

    def __len__(self) -> int:
        length = len(self._source)
        if length <= 0:
            raise UserError(f"{_WHAT}: {self.spec!r} returned an empty source")
        return length

    def __getitem__(self, index: int) -> PreferencePair:
        return check_pair(self._source[index], f"{_WHAT} {self.spec!r} index {index}", self.media.frames)

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


def factory_source(spec: str, media: MediaSpec, /, **kwargs: Any) -> CheckedFactorySource:
    """Import ``module:function``, call it with ``kwargs``, and check what it returns (and each
    record against the run's ``media``; positional only, so a factory may take a ``media`` keyword of its own)."""
    source = resolve_factory(spec, _WHAT)(**kwargs)
    missing = [name for name in ("__len__", "__getitem__") if not hasattr(source, name)]
    if missing:
        raise UserError(
            f"{_WHAT}: {spec!r} returned {type(source).__name__}, which lacks {', '.join(missing)}; "
            "a pair source needs __len__ and __getitem__(i) -> PreferencePair"
        )
    return CheckedFactorySource(source, spec, media)
