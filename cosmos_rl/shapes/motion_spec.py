"""What a moving-shapes prompt asks for: clauses of an object and what it does over the clip.

A video spec holds one or two *clauses*; a clause is an image-world group (a shape, an optional
colour, a count) and an *action*:

===============  ================================  ==========================================
action           caption words                     what the object does over the clip
===============  ================================  ==========================================
``move``         "moving left"                     travels in a straight line, one direction
``turn``         "moving left then up"             the first direction, then a second one
``still``        "staying still"                   stays where it is
``change``       "turning from red to blue"        stays, and its colour switches once
===============  ================================  ==========================================

The task is a pure function of the spec's structure:

================  ===============================================  ========================================
task              structure                                        example
================  ===============================================  ========================================
motion            one object moving one way                        "a red circle moving left"
two_motions       two objects moving two different ways            "a circle moving up and a square moving left"
static            one object staying still, alone or with a        "a red square staying still",
                  second object (still or moving)                  "a circle staying still and a square moving down"
colour_change     one object of no named colour changing colour    "a square turning from red to blue"
counting_motion   two or three of a shape, all moving one way      "three blue triangles moving down"
turn              one object moving one way and then another       "a circle moving left then up"
================  ===============================================  ========================================

Two clauses must name objects the verifier can tell apart at every frame, as the image world's
two-object tasks do: two different shapes and no colours, or two colours that differ. Anything
else is refused by :meth:`MotionSpec.__post_init__` (and so by the caption parser).

Every spec but a colour change has a *frame spec*: the image-world spec each single frame must
satisfy on its own ("a red circle moving left" -> "a red circle"). It is what an image reward
scores frame by frame, and it cannot see time (see docs/shapes.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from cosmos_rl.shapes.spec import COLOURS, Group, Spec

MOTION_TASKS: tuple[str, ...] = ("motion", "two_motions", "static", "colour_change", "counting_motion", "turn")
ACTIONS: tuple[str, ...] = ("move", "turn", "still", "change")
# Direction -> unit step (dx, dy) in image coordinates (y grows downwards).
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}

# The verifier's tolerances, shared with the renderer so that ground truth clears them with room.
# Travel is a fraction of the frame side along the motion's axis; the others of the shorter side.
MIN_TRAVEL = 0.25  # net displacement along the direction
BACKSTEP = 0.05  # how far one frame-to-frame step may go against the direction
DRIFT = 0.1  # how far the object may stray across the direction from where it started
STILL = 0.05  # how far a still object may stray from its first position
SWITCH_JUMP = 0.1  # how far a colour-changing object may jump at the frame its colour switches


@dataclass(frozen=True)
class Clause:
    """``group`` doing ``action``; ``args`` are its directions (move: 1, turn: 2) or colours (change: 2)."""

    group: Group
    action: str
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {ACTIONS}")
        want = {"move": (1, DIRECTIONS), "turn": (2, DIRECTIONS), "still": (0, ()), "change": (2, COLOURS)}
        n, words = want[self.action]
        if len(self.args) != n or any(a not in words for a in self.args):
            raise ValueError(f"{self.action!r} takes {n} of {tuple(words)}, got {self.args!r}")
        if self.action == "turn" and self.args[0] == self.args[1]:
            raise ValueError(f"a turn needs two different directions, got {self.args!r}")
        if self.action == "change":
            if self.args[0] == self.args[1]:
                raise ValueError(f"a colour change needs two different colours, got {self.args!r}")
            if self.group.colour is not None:
                raise ValueError("an object that changes colour names its colours in 'turning from ... to ...' only")
        if self.group.count > 1 and self.action != "move":
            raise ValueError("two or three objects can only move, all one way (\"two circles moving left\")")

    def words(self) -> str:
        """The action's caption words: "moving left", "moving left then up", "staying still", ..."""
        if self.action == "move":
            return f"moving {self.args[0]}"
        if self.action == "turn":
            return f"moving {self.args[0]} then {self.args[1]}"
        if self.action == "still":
            return "staying still"
        return f"turning from {self.args[0]} to {self.args[1]}"

    def phrase(self) -> str:
        return f"{self.group.phrase()} {self.words()}"

    def key(self) -> tuple[str, str, int, str]:
        return (self.group.shape, self.group.colour or "", self.group.count, self.words())


@dataclass(frozen=True)
class MotionSpec:
    """One prompt of the moving-shapes world: one or two clauses, joined by "and"."""

    clauses: tuple[Clause, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.clauses) <= 2:
            raise ValueError(f"a video spec has one or two clauses, got {len(self.clauses)}")
        if len(self.clauses) == 1:
            return
        a, b = self.clauses
        if any(c.group.count > 1 or c.action in ("turn", "change") for c in self.clauses):
            raise ValueError("two clauses are single objects, each moving one way or staying still")
        if (a.group.colour is None) != (b.group.colour is None):
            raise ValueError("two objects either both name a colour or neither does")
        if a.group.colour is None and a.group.shape == b.group.shape:
            raise ValueError("two objects without colours must be different shapes")
        if a.group.colour is not None and a.group.colour == b.group.colour:
            raise ValueError("two coloured objects must have different colours")
        if a.action == b.action == "move" and a.args == b.args:
            raise ValueError(f"two moving objects go different ways; for one way use \"two ... moving {a.args[0]}\"")

    def caption(self) -> str:
        return " and ".join(clause.phrase() for clause in self.clauses)

    @property
    def n_objects(self) -> int:
        return sum(c.group.count for c in self.clauses)

    @property
    def task(self) -> str:
        if len(self.clauses) == 2:
            return "static" if any(c.action == "still" for c in self.clauses) else "two_motions"
        (clause,) = self.clauses
        if clause.group.count > 1:
            return "counting_motion"
        return {"move": "motion", "turn": "turn", "still": "static", "change": "colour_change"}[clause.action]

    def canonical(self) -> "MotionSpec":
        """The same request in one spelling (clauses sorted): the held-out split is made on these."""
        return MotionSpec(tuple(sorted(self.clauses, key=Clause.key)))

    def frame_spec(self) -> Optional[Spec]:
        """The image-world spec every frame satisfies on its own; None for a colour change."""
        if any(c.action == "change" for c in self.clauses):
            return None
        return Spec(tuple(c.group for c in self.clauses))

    def frame_caption(self) -> Optional[str]:
        spec = self.frame_spec()
        return None if spec is None else spec.caption()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (written in .jsonl prompt files)."""
        return {"clauses": [{"shape": c.group.shape, "colour": c.group.colour, "count": c.group.count,
                             "action": c.action, "args": list(c.args)} for c in self.clauses]}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "MotionSpec":
        return MotionSpec(tuple(
            Clause(Group(c["shape"], c.get("colour"), int(c.get("count", 1))), c["action"], tuple(c.get("args", ())))
            for c in data["clauses"]
        ))
