"""Caption text -> :class:`~cosmos_rl.shapes.spec.Spec`, the inverse of ``Spec.caption()``.

The grammar (case and runs of spaces do not matter; one trailing full stop is allowed)::

    caption  := phrase | phrase " and " phrase | phrase " " relation " " phrase
    phrase   := ("a" | "two" | "three") [colour] shape     (shape plural after "two"/"three")
    relation := "to the left of" | "to the right of" | "above" | "below"

Anything else is refused with a :class:`CaptionError` that says what was expected: the verifier
must never score an image against constraints it guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cosmos_rl.core.errors import UserError
from cosmos_rl.shapes.spec import COLOURS, COUNT_WORDS, MAX_OBJECTS, RELATION_WORDS, SHAPES, Group, Spec


class CaptionError(UserError, ValueError):
    """A caption outside the shapes world's grammar (a ValueError, so the reward service answers 400)."""


_COUNTS = {word: count for count, word in COUNT_WORDS.items()}
_PLURALS = {shape + "s": shape for shape in SHAPES}
# Longest first so "to the left of" is never read as a shorter joint.
_JOINTS = sorted([("and", None)] + [(words, rel) for rel, words in RELATION_WORDS.items()],
                 key=lambda item: -len(item[0]))
_JOINT_RE = re.compile(r" (" + "|".join(re.escape(words) for words, _ in _JOINTS) + r") ")


def _fail(caption: str, problem: str) -> CaptionError:
    return CaptionError(
        f"caption {caption!r}: {problem}; shapes captions look like \"a red circle\", "
        "\"two squares\", \"a circle and a blue triangle\" or \"a red square to the left of a circle\""
    )


def parse_group(caption: str, words: list[str], fail: Callable[[str, str], CaptionError]) -> Group:
    """The group a phrase's ``words`` name (``phrase`` in the grammar above, in either world);
    ``fail(caption, problem)`` makes the error, so it speaks in the caller's world."""
    phrase = " ".join(words)
    if not words or words[0] not in _COUNTS:
        raise fail(caption, f"{phrase!r} should start with one of {', '.join(repr(w) for w in _COUNTS)}")
    count, rest = _COUNTS[words[0]], words[1:]
    colour = None
    if len(rest) == 2:
        colour = rest[0]
        if colour not in COLOURS:
            raise fail(caption, f"{colour!r} is not a colour of the shapes world ({', '.join(COLOURS)})")
    elif len(rest) != 1:
        raise fail(caption, f"{phrase!r} should be a count, an optional colour and a shape")
    noun = rest[-1]
    if count == 1:
        if noun not in SHAPES:
            hint = " (singular after 'a')" if noun in _PLURALS else ""
            raise fail(caption, f"{noun!r} is not a shape of the shapes world ({', '.join(SHAPES)}){hint}")
        return Group(noun, colour, 1)
    if noun not in _PLURALS:
        hint = " (plural after a count)" if noun in SHAPES else ""
        raise fail(caption, f"{noun!r} is not a plural shape ({', '.join(_PLURALS)}){hint}")
    return Group(_PLURALS[noun], colour, count)


def caption_text(caption: str, fail: Callable[[str, str], CaptionError], what: str = "caption") -> str:
    """``caption`` lower-cased with its spaces folded and one trailing full stop dropped (either
    world's captions); a CaptionError when it is not text (``what`` names it) or nothing is left."""
    if not isinstance(caption, str):
        raise CaptionError(f"a {what} must be text, got {type(caption).__name__}")
    text = " ".join(caption.strip().lower().split())
    if text.endswith("."):
        text = text[:-1].rstrip()
    if not text:
        raise fail(caption, "it is empty")
    return text


def parse_caption(caption: str) -> Spec:
    """The spec a caption asks for; CaptionError when the text is outside the grammar above."""
    text = caption_text(caption, _fail)
    parts = _JOINT_RE.split(text)
    if len(parts) > 3:
        raise _fail(caption, "it joins more than two phrases")
    if len(parts) == 1:
        return Spec((parse_group(caption, text.split(" "), _fail),))
    first, joint, second = parts
    groups = (parse_group(caption, first.split(" "), _fail), parse_group(caption, second.split(" "), _fail))
    relation = dict(_JOINTS)[joint]
    if relation is not None and any(g.count != 1 for g in groups):
        raise _fail(caption, f"{joint!r} relates two single objects ('a ...'), not groups")
    if sum(g.count for g in groups) > MAX_OBJECTS:
        raise _fail(caption, f"it asks for more than {MAX_OBJECTS} objects")
    return Spec(groups, relation)


def task_of(caption: str) -> str:
    """The task (one of :data:`cosmos_rl.shapes.spec.TASKS`) a caption belongs to."""
    return parse_caption(caption).task
