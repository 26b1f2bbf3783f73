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

from cosmos_rl.shapes.caption import CaptionError, caption_text, parse_group
from cosmos_rl.shapes.motion_spec import DIRECTIONS, Clause, MotionSpec
from cosmos_rl.shapes.spec import COLOURS

_VERBS = ("moving", "staying", "turning")


def _fail(caption: str, problem: str) -> CaptionError:
    return CaptionError(
        f"video caption {caption!r}: {problem}; moving-shapes captions look like \"a red circle moving left\", "
        "\"two squares moving up\", \"a circle staying still and a blue square moving down\", "
        "\"a square turning from red to blue\" or \"a circle moving left then up\""
    )


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
    group = parse_group(caption, words[:verb], _fail)
    action, args = _action(caption, words[verb:])
    try:
        return Clause(group, action, args)
    except ValueError as exc:
        raise _fail(caption, str(exc)) from None


def parse_motion_caption(caption: str) -> MotionSpec:
    """The video spec a caption asks for; CaptionError when the text is outside the grammar above."""
    text = caption_text(caption, _fail, "video caption")
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
