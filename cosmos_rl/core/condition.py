"""What a sample is conditioned on, as one value: which of its frames are given clean, and where
they come from.

Every sample a run generates or trains on carries one `Condition`, built once from the manifest's
`[model.condition]` table (`Condition.from_model_config`). It is the one thing the sampler, the
trainers' losses, the data readers, the rewards and `eval` ask about conditioning:

- `kind` (a `ConditionKind`): which leading frames are given. Built in: `none` (text to image or
  video) and `first_frame` (image to video: the pipeline's `image=`, frame 0 given). A kind defined
  outside the package is named by an import string `package.module:ENTRY` (an instance of
  `ConditionKind`), as stand-in algorithms are;
- `source`: where a sample's given frames come from: `image` (each prompt row's `image` file),
  `data` (a training sample's own frames: SFT's teacher forcing), or a suite's name or import
  string (the suite's ground truth of each caption);
- `probability`: the share of training samples conditioned (SFT trains T2V and I2V at once with
  0.5); rollouts and evaluation condition every sample of a conditioned run.

For generation a condition is the leading latent frames held clean (`clean_latent_frames`):
written over the noise, given no timestep, never predicted and never in any loss. Torch-free:
`validate` and preflight use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosmos_rl.core.imports import load_attr
from cosmos_rl.core.media import MediaSpec, latent_frames

# Sources that are no suite: a prompt row's image file, a training sample's own frames, nothing.
FILE_SOURCES = ("image", "data")


@dataclass(frozen=True)
class ConditionKind:
    """Which leading pixel frames of a sample are given: `given_frames` of them (0: none)."""

    name: str
    given_frames: int
    description: str

    def clean_latent_frames(self, media: MediaSpec, temporal_factor: int) -> int:
        """Leading latent frames of a `media` sample held clean: the Wan encoder's latent frames of
        the given pixel frames (frame 0 alone is latent frame 0; 4k + 1 frames are 1 + 4k / factor)."""
        if not self.given_frames:
            return 0
        if self.given_frames >= media.frames:
            raise ValueError(f"condition {self.name!r} gives {self.given_frames} frames: nothing left to generate of a {media.frames}-frame sample")
        return latent_frames(self.given_frames, temporal_factor)


NONE = ConditionKind("none", 0, "generated from the prompt alone")
FIRST_FRAME = ConditionKind("first_frame", 1, "the first frame given clean (image to video)")
BUILT_IN = {kind.name: kind for kind in (NONE, FIRST_FRAME)}


class UnknownCondition(ValueError):
    """`model.condition.kind` names no built-in kind and no importable `module:ENTRY`."""


def kind_named(name: str) -> ConditionKind:
    """The kind `name` names: a built-in, or an import string `module:ENTRY` (a `ConditionKind`)."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise UnknownCondition(f"one of {', '.join(BUILT_IN)}, or an import string package.module:ENTRY")
    try:
        entry = load_attr(name)
    except (ImportError, AttributeError) as exc:
        raise UnknownCondition(f"cannot import it ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, ConditionKind):
        raise UnknownCondition(f"names a {type(entry).__name__}, not a cosmos_rl.core.condition.ConditionKind")
    return entry


@dataclass(frozen=True)
class Condition:
    """The clean, given part of every sample (see the module docstring)."""

    kind: ConditionKind = NONE
    source: str = "none"
    probability: float = 1.0

    def __post_init__(self) -> None:
        if (self.kind.given_frames == 0) != (self.source == "none"):
            raise ValueError(f"a condition has a source exactly when it gives frames, got {self}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"condition probability must be in [0, 1], got {self.probability}")

    @classmethod
    def from_model_config(cls, model: Any) -> "Condition":
        """The condition of a manifest's `[model]` table (`schema.ModelConfig`, preflighted)."""
        table = model.condition
        kind = kind_named(table.kind)
        if not kind.given_frames:
            return cls()
        return cls(kind=kind, source=table.source, probability=float(table.probability))

    @property
    def is_conditioned(self) -> bool:
        """Some leading frames are given clean."""
        return self.kind.given_frames > 0

    @property
    def from_suite(self) -> bool:
        """The given frames are a suite's ground truth (a suite name or import string)."""
        return self.is_conditioned and self.source not in FILE_SOURCES

    def evaluated(self) -> "Condition":
        """The condition a run is evaluated under by default: its own when every sample carries it;
        none when only a share does (SFT's mix of T2V and I2V evaluates text to video unless asked)."""
        return self if self.probability == 1.0 else Condition()

    def clean_latent_frames(self, media: MediaSpec, temporal_factor: int) -> int:
        """Leading latent frames a generation of `media` holds clean (0: none)."""
        return self.kind.clean_latent_frames(media, temporal_factor)

    def describe(self) -> str:
        """One line for `plan` and logs."""
        if not self.is_conditioned:
            return NONE.description
        share = "" if self.probability == 1.0 else f", {self.probability:g} of training samples"
        return f"{self.kind.description}, from {self.source}{share}"
