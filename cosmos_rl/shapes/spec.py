"""What a shapes-world prompt asks for: a structured spec, its caption and its task.

A spec holds one or two *groups* (a shape, an optional colour, a count) and, for two groups
of one object each, an optional relation "first group <relation> second group". The caption is
a pure function of the spec (``caption``), and :func:`cosmos_rl.shapes.caption.parse_caption`
is its inverse. The task (GenEval's six families) is a pure function of the spec's structure:

===================  ==========================================  ==================================
task                 structure                                   example
===================  ==========================================  ==================================
single_object        one object, no colour                       "a circle"
colours              one object with a colour                    "a red circle"
counting             one group of two or three                   "two circles", "three red squares"
two_objects          two groups joined by "and", no colour       "a circle and a square"
colour_attribution   two groups joined by "and", with colours    "a red circle and a blue square"
position             two objects and a relation                  "a red circle to the left of a square"
===================  ==========================================  ==================================

Colours are the project's palette (:data:`cosmos_rl.data.vocab.PALETTE`, RGB from
:data:`cosmos_rl.data.vocab.COLOUR_RGB255`): any two palette colours differ by a full channel,
so colour segmentation against it is exact. The background is black, which is just as far from
every palette colour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from cosmos_rl.data.vocab import COLOUR_RGB255, PALETTE

# Not cosmos_rl.data.vocab.SHAPES: that tuple is what synthetic pairs draw ("stripe", no
# triangle), and this world needs three shapes a verifier can tell apart by fill ratio.
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COLOURS: tuple[str, ...] = PALETTE
BACKGROUND = "black"
RGB: dict[str, tuple[int, int, int]] = {name: COLOUR_RGB255[name] for name in (BACKGROUND, *COLOURS)}

MAX_OBJECTS = 3
# Smallest image side the world renders and the verifier reads (see cosmos_rl.shapes.analyse).
MIN_SIDE = 32
COUNT_WORDS: dict[int, str] = {1: "a", 2: "two", 3: "three"}
# Relation -> the words a caption uses for it. "right of"/"below" are the mirrors of
# "left of"/"above" (A right of B == B left of A); canonical() keeps the first two only.
RELATION_WORDS: dict[str, str] = {
    "left of": "to the left of",
    "right of": "to the right of",
    "above": "above",
    "below": "below",
}
_MIRROR = {"right of": "left of", "below": "above"}

TASKS: tuple[str, ...] = (
    "single_object", "two_objects", "counting", "colours", "position", "colour_attribution",
)


@dataclass(frozen=True)
class Group:
    """``count`` objects of ``shape``, all of ``colour`` (None: the caption names no colour)."""

    shape: str
    colour: Optional[str] = None
    count: int = 1

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} is not one of {SHAPES}")
        if self.colour is not None and self.colour not in COLOURS:
            raise ValueError(f"colour {self.colour!r} is not one of {COLOURS}")
        if self.count not in COUNT_WORDS:
            raise ValueError(f"count {self.count!r} is not one of {tuple(COUNT_WORDS)}")

    def phrase(self) -> str:
        """"a circle", "two red squares"."""
        words = [COUNT_WORDS[self.count]]
        if self.colour is not None:
            words.append(self.colour)
        words.append(self.shape + ("s" if self.count > 1 else ""))
        return " ".join(words)


@dataclass(frozen=True)
class Spec:
    """One prompt of the world; ``relation`` reads "groups[0] <relation> groups[1]"."""

    groups: tuple[Group, ...]
    relation: Optional[str] = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.groups) <= 2:
            raise ValueError(f"a spec has one or two groups, got {len(self.groups)}")
        if sum(g.count for g in self.groups) > MAX_OBJECTS:
            raise ValueError(f"a spec asks for at most {MAX_OBJECTS} objects, got {self.groups}")
        if self.relation is not None:
            if self.relation not in RELATION_WORDS:
                raise ValueError(f"relation {self.relation!r} is not one of {tuple(RELATION_WORDS)}")
            if len(self.groups) != 2 or any(g.count != 1 for g in self.groups):
                raise ValueError("a relation joins exactly two single objects")

    @property
    def n_objects(self) -> int:
        return sum(g.count for g in self.groups)

    def caption(self) -> str:
        if len(self.groups) == 1:
            return self.groups[0].phrase()
        joint = "and" if self.relation is None else RELATION_WORDS[self.relation]
        return f"{self.groups[0].phrase()} {joint} {self.groups[1].phrase()}"

    @property
    def task(self) -> str:
        if self.relation is not None:
            return "position"
        if len(self.groups) == 2:
            return "colour_attribution" if any(g.colour for g in self.groups) else "two_objects"
        group = self.groups[0]
        if group.count > 1:
            return "counting"
        return "colours" if group.colour else "single_object"

    def canonical(self) -> "Spec":
        """The same request in one spelling: "B right of A" -> "A left of B", "and" groups sorted.

        Two specs with the same canonical form ask for the same images, so the train/held-out
        split is made on canonical forms and no held-out prompt is a reordering of a training one.
        """
        if self.relation in _MIRROR:
            return Spec((self.groups[1], self.groups[0]), _MIRROR[self.relation])
        if self.relation is None and len(self.groups) == 2:
            return Spec(tuple(sorted(self.groups, key=_group_key)))
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (written next to each shard image and in .jsonl prompt files)."""
        return {
            "groups": [{"shape": g.shape, "colour": g.colour, "count": g.count} for g in self.groups],
            "relation": self.relation,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "Spec":
        groups = tuple(Group(g["shape"], g.get("colour"), int(g.get("count", 1))) for g in data["groups"])
        return Spec(groups, data.get("relation"))


def _group_key(group: Group) -> tuple[str, str, int]:
    return (group.shape, group.colour or "", group.count)


# A relation needs the centroids this far apart along its axis, as a fraction of the shorter
# image side, so that two objects side by side with jittered centres are not "left of" each other.
RELATION_MARGIN = 0.1


def relation_offsets(a: tuple[float, float], b: tuple[float, float], relation: str) -> tuple[float, float]:
    """(along, across): how far centroid ``a`` = (x, y) lies in the relation's direction from
    ``b``, and sideways from it (image y grows downwards)."""
    (ax, ay), (bx, by) = a, b
    if relation == "left of":
        return bx - ax, by - ay
    if relation == "right of":
        return ax - bx, by - ay
    if relation == "above":
        return by - ay, bx - ax
    if relation == "below":
        return ay - by, bx - ax
    raise ValueError(f"relation {relation!r} is not one of {tuple(RELATION_WORDS)}")


def relation_holds(a: tuple[float, float], b: tuple[float, float], relation: str, height: int, width: int) -> bool:
    """Whether centroid ``a`` is ``relation`` centroid ``b`` in a height x width image.

    The offset must be more along the relation's axis than across it (so at most one of the
    four relations holds for a pair) and exceed RELATION_MARGIN of the shorter side. At 32x32
    (margin 3.2 px): a=(8, 16), b=(20, 18) -> along 12 > 3.2 and > |2|: "left of" holds;
    a=(8, 4), b=(20, 20) -> along 12 < |16|: it does not (that is "above").
    """
    along, across = relation_offsets(a, b, relation)
    return along > RELATION_MARGIN * min(height, width) and along > abs(across)
