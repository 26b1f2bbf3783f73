"""A stand-in suite from outside the package: a world of flat colours, named in a manifest as
`rl.eval.suite = "standin_suite:SUITE"` (or `cosmos-rl eval --suite standin_suite:SUITE`), its rewards
as `standin_suite:SUITE/colour_match` and `standin_suite:SUITE/colour_fraction`. The worked example
of docs/architecture.md, "Adding a suite", and the proof that a world needs no edit under
cosmos_rl/ (tests/test_suites.py evaluates and trains with it).

The world: a caption names one colour ("a red image"); its image is that colour everywhere. The
verifier is exact: a pixel matches when each channel is within TOLERANCE of the named colour;
partial = the fraction of pixels that match, strict = 1 when all of them do. Tasks: `primary`
(red, green, blue) and `secondary` (cyan, magenta, yellow). It judges 32x32 images, has no base
preset and no given first frames.
"""

from __future__ import annotations

import numpy as np

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites.base import Suite, SuiteReward, spread

TASKS = ("primary", "secondary")
COLOURS = {
    "primary": {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)},
    "secondary": {"cyan": (0, 255, 255), "magenta": (255, 0, 255), "yellow": (255, 255, 0)},
}
TOLERANCE = 40  # per channel, of 255
_RGB = {name: rgb for colours in COLOURS.values() for name, rgb in colours.items()}


def caption(colour: str) -> str:
    return f"a {colour} image"


def parse(text: str) -> tuple[str, str]:
    """(colour, task) of a caption; ValueError for anything but "a COLOUR image"."""
    words = text.lower().split()
    if len(words) != 3 or words[0] != "a" or words[2] != "image" or words[1] not in _RGB:
        raise ValueError(f"caption {text!r}: not 'a COLOUR image' with COLOUR one of {', '.join(_RGB)}")
    return words[1], next(task for task, colours in COLOURS.items() if words[1] in colours)


def task_of(text: str) -> str:
    return parse(text)[1]


def held_out(per_task: int) -> list[tuple[str, str]]:
    return [(caption(colour), task) for task in TASKS for colour in spread(list(COLOURS[task]), per_task)]


def verify(images: np.ndarray, captions) -> tuple[list[float], list[float]]:
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be uint8 [N, H, W, 3], got {getattr(images, 'shape', type(images).__name__)}")
    if len(captions) != images.shape[0]:
        raise ValueError(f"got {images.shape[0]} images but {len(captions)} captions")
    targets = np.array([_RGB[parse(c)[0]] for c in captions], dtype=np.int16)  # every caption parsed first
    close = (np.abs(images.astype(np.int16) - targets[:, None, None, :]) <= TOLERANCE).all(axis=-1)
    partial = [float(m.mean()) for m in close]
    return [float(p == 1.0) for p in partial], partial


def score(images: np.ndarray, prompts, mode: str = "strict") -> list[float]:
    strict, partial = verify(images, prompts)
    return strict if mode == "strict" else partial


SUITE = Suite(
    name="standin", title="flat-colour", media=MediaSpec.image(32),
    rewards=(
        SuiteReward(name="colour_match", scorer=score, part="strict"),
        SuiteReward(name="colour_fraction", scorer=score, part="partial"),
    ),
    tasks_of=TASKS, held_out_prompts=held_out, held_out_title="flat-colour held-out prompts",
    caption_task=task_of, verifier=verify, prompt_source="lines like 'a red image'",
)  # fmt: skip
