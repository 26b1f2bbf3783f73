"""Video caption text -> :class:`~cosmos_rl.shapes.motion_spec.MotionSpec`, the inverse of ``caption()``.

The grammar (case and runs of spaces do not matter; one trailing full stop is allowed)::

    caption   := clause | clause " and " clause
    clause    := phrase " " action
    phrase    := ("a" | "two" | "three") [colour] shape      (as in the image world)
    action    := "moving " direction [" then " direction]
               | "staying still"
               | "turning from " colour " to " colour
    direction := "left" | "right" | "up" | "down"

on top of which :class:`MotionSpec` refuses what no task asks for (two moving one way, a count
that does not move, a colour change with a colour in its phrase, ...). Anything else is refused
with a :class:`~cosmos_rl.shapes.caption.CaptionError` that quotes the caption: the verifier must
never score a clip against constraints it guessed.
"""

from __future__ import annotations

from cosmos_rl.shapes.caption import CaptionError
from cosmos_rl.shapes.motion_spec import DIRECTIONS, Clause, MotionSpec
from cosmos_rl.shapes.spec import COLOURS, COUNT_WORDS, SHAPES, Group

_COUNTS = {word: count for count, word in COUNT_WORDS.items()}
_PLURALS = {shape + "s": shape for shape in SHAPES}
_VERBS = ("moving", "staying", "turning")


def _fail(caption: str, problem: str) -> CaptionError:
    return CaptionError(
        f"video caption {caption!r}: {problem}; moving-shapes captions look like \"a red circle moving left\", "
        "\"two squares moving up\", \"a circle staying still and a blue square moving down\", "
        "\"a square turning from red to blue\" or \"a circle moving left then up\""
    )


def _group(caption: str, words: list[str]) -> Group:
    phrase = " ".join(words)
    if not words or words[0] not in _COUNTS:
        raise _fail(caption, f"{phrase!r} should start with one of {', '.join(repr(w) for w in _COUNTS)}")
    count, rest = _COUNTS[words[0]], words[1:]
    colour = None
    if len(rest) == 2:
        colour = rest[0]
        if colour not in COLOURS:
            raise _fail(caption, f"{colour!r} is not a colour of the shapes world ({', '.join(COLOURS)})")
    elif len(rest) != 1:
        raise _fail(caption, f"{phrase!r} should be a count, an optional colour and a shape")
    noun = rest[-1]
    if count == 1:
        if noun not in SHAPES:
            hint = " (singular after 'a')" if noun in _PLURALS else ""
            raise _fail(caption, f"{noun!r} is not a shape of the shapes world ({', '.join(SHAPES)}){hint}")
        return Group(noun, colour, 1)
    if noun not in _PLURALS:
        hint = " (plural after a count)" if noun in SHAPES else ""
        raise _fail(caption, f"{noun!r} is not a plural shape ({', '.join(_PLURALS)}){hint}")
    return Group(_PLURALS[noun], colour, count)


def _action(caption: str, words: list[str]) -> tuple[str, tuple[str, ...]]:
    text = " ".join(words)
    directions = ", ".join(repr(d) for d in DIRECTIONS)
    if words[0] == "moving":
        if len(words) == 2 and words[1] in DIRECTIONS:
            return "move", (words[1],)
        if len(words) == 4 and words[2] == "then" and words[1] in DIRECTIONS and words[3] in DIRECTIONS:
            return "turn", (words[1], words[3])
        raise _fail(caption, f"{text!r} should be 'moving' and a direction ({directions}), optionally "
                             "'then' and another")
    if words[0] == "staying":
        if words == ["staying", "still"]:
            return "still", ()
        raise _fail(caption, f"{text!r} should be 'staying still'")
    if len(words) == 5 and words[1] == "from" and words[3] == "to" and words[2] in COLOURS and words[4] in COLOURS:
        return "change", (words[2], words[4])
    raise _fail(caption, f"{text!r} should be 'turning from' a colour 'to' another ({', '.join(COLOURS)})")


def _clause(caption: str, text: str) -> Clause:
    words = text.split(" ")
    verb = next((i for i, word in enumerate(words) if word in _VERBS), None)
    if verb is None:
        raise _fail(caption, f"{text!r} does not say what the object does ('moving ...', 'staying still', "
                             "'turning from ... to ...')")
    group = _group(caption, words[:verb])
    action, args = _action(caption, words[verb:])
    try:
        return Clause(group, action, args)
    except ValueError as exc:
        raise _fail(caption, str(exc)) from None


def parse_motion_caption(caption: str) -> MotionSpec:
    """The video spec a caption asks for; CaptionError when the text is outside the grammar above."""
    if not isinstance(caption, str):
        raise CaptionError(f"a video caption must be text, got {type(caption).__name__}")
    text = " ".join(caption.strip().lower().split())
    if text.endswith("."):
        text = text[:-1].rstrip()
    if not text:
        raise _fail(caption, "it is empty")
    parts = text.split(" and ")
    if len(parts) > 2:
        raise _fail(caption, "it joins more than two clauses")
    clauses = tuple(_clause(caption, part) for part in parts)
    try:
        return MotionSpec(clauses)
    except ValueError as exc:
        raise _fail(caption, str(exc)) from None


def motion_task_of(caption: str) -> str:
    """The task (one of :data:`cosmos_rl.shapes.motion_spec.MOTION_TASKS`) a video caption belongs to."""
    return parse_motion_caption(caption).task
