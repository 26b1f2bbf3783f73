"""What a sample is conditioned on, as one value: which of its frames are given clean, and where
they come from.

Every sample a run generates or trains on carries one `Condition`, built once from the manifest's
`[model.condition]` table (`Condition.from_model_config`). It is the one thing the sampler, the
trainers' losses, the data readers, the rewards and `eval` ask about conditioning:

- `kind` (a `ConditionKind`): which leading frames are given. Built in: `none` (text to image or
  video) and `first_frame` (image to video: the pipeline's `image=`, frame 0 given), and the world
  model's action modes (the pipeline's `action=`, core/actions.py): `forward_dynamics` (frame 0 and
  the action rows given; the frames generated), `policy` (frame 0 given; frames and action rows
  generated) and `inverse_dynamics` (every frame given; the action rows generated). A kind defined
  outside the package is named by an import string `package.module:ENTRY` (an instance of
  `ConditionKind`), as stand-in algorithms are;
- `source`: where a sample's given frames come from: `image` (each prompt row's `image` file),
  `data` (a training sample's own frames: SFT's teacher forcing), or a suite's name or import
  string (the suite's ground truth of each caption);
- `probability`: the share of training samples conditioned (SFT trains T2V and I2V at once with
  0.5); rollouts and evaluation condition every sample of a conditioned run;
- `action` (an action mode's kind only): the `ActionSpec` of `[model.action]` (embodiment, view,
  normalisation) over a chunk of `model.num_frames - 1` rows.

For generation a condition is the leading latent frames held clean (`clean_latent_frames`):
written over the noise, given no timestep, never predicted and never in any loss. Torch-free:
`validate` and preflight use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cosmos_rl.core.actions import ACTION_MODES, ActionSpec
from cosmos_rl.core.imports import load_attr
from cosmos_rl.core.media import MediaSpec, latent_frames

# Sources that are no suite: a prompt row's image file, a training sample's own frames, nothing.
FILE_SOURCES = ("image", "data")


@dataclass(frozen=True)
class ConditionKind:
    """Which leading pixel frames of a sample are given: `given_frames` of them (0: none), and for
    the world model's kinds its `action_mode` (core/actions.ACTION_MODES; "" for none), whose
    inverse dynamics gives every frame (`given_frames` is then the least, 1)."""

    name: str
    given_frames: int
    description: str
    action_mode: str = ""

    def __post_init__(self) -> None:
        if self.action_mode and self.action_mode not in ACTION_MODES:
            raise ValueError(f"condition kind {self.name!r}: action mode {self.action_mode!r} is not one of {ACTION_MODES}")

    @property
    def every_frame(self) -> bool:
        """Every frame given (inverse dynamics: the action rows are what is generated)."""
        return self.action_mode == "inverse_dynamics"

    def pixel_frames(self, media: MediaSpec) -> int:
        """Leading pixel frames of a `media` sample that are given."""
        return media.frames if self.every_frame else self.given_frames

    def clean_latent_frames(self, media: MediaSpec, temporal_factor: int) -> int:
        """Leading latent frames of a `media` sample held clean: the Wan encoder's latent frames of
        the given pixel frames (frame 0 alone is latent frame 0; 4k + 1 frames are 1 + 4k / factor)."""
        if not self.given_frames:
            return 0
        if self.every_frame:
            return latent_frames(media.frames, temporal_factor)
        if self.given_frames >= media.frames:
            raise ValueError(f"condition {self.name!r} gives {self.given_frames} frames: nothing left to generate of a {media.frames}-frame sample")
        return latent_frames(self.given_frames, temporal_factor)


NONE = ConditionKind("none", 0, "generated from the prompt alone")
FIRST_FRAME = ConditionKind("first_frame", 1, "the first frame given clean (image to video)")
FORWARD_DYNAMICS = ConditionKind(
    "forward_dynamics", 1, "the first frame and the action rows given (forward dynamics: the world's response)", "forward_dynamics"
)
POLICY = ConditionKind("policy", 1, "the first frame given; frames and action rows generated (policy)", "policy")
INVERSE_DYNAMICS = ConditionKind(
    "inverse_dynamics", 1, "every frame given; the action rows generated (inverse dynamics)", "inverse_dynamics"
)
BUILT_IN = {kind.name: kind for kind in (NONE, FIRST_FRAME, FORWARD_DYNAMICS, POLICY, INVERSE_DYNAMICS)}


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
    action: ActionSpec | None = None
    modes: tuple[str, ...] = ()  # SFT: the action modes a training window draws from (empty: the kind's alone)

    def __post_init__(self) -> None:
        if (self.kind.given_frames == 0) != (self.source == "none"):
            raise ValueError(f"a condition has a source exactly when it gives frames, got {self}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"condition probability must be in [0, 1], got {self.probability}")
        if (self.action is None) != (not self.kind.action_mode):
            raise ValueError(f"a condition has an ActionSpec exactly when its kind is an action mode, got {self}")
        if self.action is not None and self.action.mode != self.kind.action_mode:
            raise ValueError(f"condition kind {self.kind.name!r} with an ActionSpec of mode {self.action.mode!r}")
        if self.modes and (self.action is None or self.action.mode not in self.modes or not set(self.modes) <= set(ACTION_MODES)):
            raise ValueError(f"condition modes {self.modes} must be action modes that include the kind's, got kind {self.kind.name!r}")

    @classmethod
    def from_model_config(cls, model: Any) -> "Condition":
        """The condition of a manifest's `[model]` table (`schema.ModelConfig`, preflighted)."""
        table = model.condition
        kind = kind_named(table.kind)
        if not kind.given_frames:
            return cls()
        action = None
        if kind.action_mode:
            a = model.action
            action = ActionSpec(
                mode=kind.action_mode, embodiment=a.embodiment, chunk=int(model.num_frames) - 1,
                view_point=a.view_point or None, offset=tuple(a.offset) if a.offset else None, scale=tuple(a.scale) if a.scale else None,
            )  # fmt: skip
        modes = tuple(dict.fromkeys(table.modes)) if action is not None else ()
        return cls(kind=kind, source=table.source, probability=float(table.probability), action=action, modes=modes)

    def training_specs(self) -> tuple[ActionSpec, ...]:
        """The ActionSpec of each mode a training window may draw (the kind's alone without `modes`)."""
        if self.action is None:
            return ()
        return tuple(dataclasses.replace(self.action, mode=mode) for mode in self.modes) if self.modes else (self.action,)

    @property
    def is_conditioned(self) -> bool:
        """Some leading frames are given clean."""
        return self.kind.given_frames > 0

    @property
    def from_suite(self) -> bool:
        """The given frames are a suite's ground truth (a suite name or import string)."""
        return self.is_conditioned and self.source not in FILE_SOURCES

    @property
    def has_actions(self) -> bool:
        """Each sample carries action rows (an action mode: given or generated)."""
        return self.action is not None

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
