"""What an action condition is, as one value (torch-free): Cosmos3 as a world model.

`Cosmos3OmniPipeline` (diffusers 0.42.1) denoises robot actions as a modality beside the frames:
a clip of `chunk + 1` frames and `chunk` action rows (one per transition between frames), each row
an embodiment's raw action vector zero-padded to the transformer's `action_dim`, read and written
through that embodiment's own projection (`action_domain_ids`). Three modes:

- `forward_dynamics`: frame 0 and every action row clean; the later frames are generated (the
  world's response to the actions);
- `inverse_dynamics`: every latent frame clean; the action rows are generated (the actions that
  explain a clip);
- `policy`: frame 0 clean; the later frames and the action rows are generated together.

`ActionSpec` is that choice for a batch: the mode, the embodiment (its domain id and width), the
chunk, the camera view the caption names, and how raw actions map onto the rows the model sees
(`offset`/`scale`, identity when unset: the pipeline feeds raw actions unchanged). The tables
below mirror the pipeline's own (`_EMBODIMENT_TO_DOMAIN_ID`, `_EMBODIMENT_TO_RAW_ACTION_DIM`,
`_ACTION_VIEWPOINT_TEMPLATES`, `_ACTION_RESOLUTION_BINS`); `action_caption` is its
`_build_action_json_prompt`, the structured caption an action model was trained on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

from cosmos_rl.core.media import DEFAULT_FPS, MediaSpec, latent_frames

ACTION_MODES = ("forward_dynamics", "inverse_dynamics", "policy")

# Embodiment -> the domain id that selects its action projections (several share one).
EMBODIMENT_DOMAIN_IDS = {
    "no_action": 0,
    "av": 1,
    "camera_pose": 2,
    "hand_pose": 3,
    "pusht": 4,
    "libero": 5,
    "umi": 6,
    "bridge_orig_lerobot": 7,
    "droid_lerobot": 8,
    "robomind-franka": 8,
    "galbot": 9,
    "robomind-franka-dual": 12,
    "robomind-ur": 13,
    "agibotworld": 15,
    "agibot_gear_gripper": 15,
    "agibot_gear_gripper_ext": 15,
    "fractal": 20,
}

# Embodiment -> its raw action width (the row's columns before zero padding to action_dim). The
# pipeline has no fixed width for `no_action` and `libero` (dataset-dependent), so neither has one here.
EMBODIMENT_WIDTHS = {
    "av": 9,
    "camera_pose": 9,
    "pusht": 2,
    "umi": 10,
    "bridge_orig_lerobot": 10,
    "droid_lerobot": 10,
    "robomind-franka": 10,
    "robomind-franka-dual": 20,
    "robomind-ur": 10,
    "galbot": 30,
    "agibotworld": 29,
    "agibot_gear_gripper": 29,
    "agibot_gear_gripper_ext": 29,
    "fractal": 10,
    "hand_pose": 57,
}

# Camera view -> the caption's `cinematography.framing` sentence (the sentences the model was trained on).
VIEW_POINTS = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent from the front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}

# The pipeline's resize policy for action runs: tier -> {height / width ratio: (height, width)}.
# The project does not resize (it takes any size the model takes); `tier_canvas` says which canvas
# the pipeline would name in its caption, for a caller who wants its exact caption.
RESOLUTION_TIERS = {
    256: {1.0: (256, 256), 0.8: (256, 320), 1.25: (320, 256), 0.6: (192, 320), 1.6666666666666667: (320, 192)},
    480: {
        1.0: (640, 640),
        0.7391304347826086: (544, 736),
        1.3529411764705883: (736, 544),
        0.5769230769230769: (480, 832),
        1.7333333333333334: (832, 480),
    },
    704: {
        1.0: (960, 960),
        0.7647058823529411: (832, 1088),
        1.3076923076923077: (1088, 832),
        0.55: (704, 1280),
        1.8181818181818181: (1280, 704),
    },
    720: {
        1.0: (960, 960),
        0.7536231884057971: (832, 1104),
        1.3269230769230769: (1104, 832),
        0.5625: (720, 1280),
        1.7777777777777777: (1280, 720),
    },
}


@dataclass(frozen=True)
class ActionSpec:
    """One action condition for every sample of a batch.

    - `mode`: one of `ACTION_MODES`; `embodiment`: a key of `EMBODIMENT_WIDTHS` (its domain id and
      raw width follow); `chunk`: action rows (transitions), so the clip has `chunk + 1` frames;
    - `view_point`: a key of `VIEW_POINTS` whose sentence the caption carries, or None for no
      framing field (the pipeline's default is "ego_view");
    - `offset`, `scale` (both or neither, one number per raw column): the model's row is
      `(raw - offset) / scale`; unset, raw actions are the model's rows (the pipeline's behaviour).
    """

    mode: str
    embodiment: str
    chunk: int
    view_point: str | None = "ego_view"
    offset: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ACTION_MODES:
            raise ValueError(f"action mode {self.mode!r} is not one of {ACTION_MODES}")
        if self.embodiment not in EMBODIMENT_WIDTHS:
            raise ValueError(
                f"embodiment {self.embodiment!r} has no fixed action width; use one of {sorted(EMBODIMENT_WIDTHS)}"
            )
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"action chunk must be a positive int (rows per clip), got {self.chunk!r}")
        if self.view_point is not None and self.view_point not in VIEW_POINTS:
            raise ValueError(f"view_point {self.view_point!r} is not one of {sorted(VIEW_POINTS)} (or None for no framing)")
        if (self.offset is None) != (self.scale is None):
            raise ValueError("give the action normalisation's offset and scale together, or neither")
        if self.offset is not None:
            for name, values in (("offset", self.offset), ("scale", self.scale)):
                if len(values) != self.width or not all(math.isfinite(float(v)) for v in values):
                    raise ValueError(
                        f"action {name} needs {self.width} finite numbers (the {self.embodiment} width), got {list(values)}"
                    )
            if any(float(v) == 0.0 for v in self.scale):
                raise ValueError(f"action scale must have no zero entry, got {list(self.scale)}")

    @property
    def width(self) -> int:
        """Raw action columns of the embodiment (the rest of a row, up to action_dim, is zero)."""
        return EMBODIMENT_WIDTHS[self.embodiment]

    @property
    def domain_id(self) -> int:
        """The embodiment's domain id, which selects its action projections."""
        return EMBODIMENT_DOMAIN_IDS[self.embodiment]

    @property
    def frames(self) -> int:
        """Pixel frames of the clip: the first frame and one after each action."""
        return self.chunk + 1

    @property
    def clean_rows(self) -> int:
        """Leading action rows held clean: all of them for forward dynamics, none otherwise."""
        return self.chunk if self.mode == "forward_dynamics" else 0

    @property
    def generates_actions(self) -> bool:
        return self.mode != "forward_dynamics"

    @property
    def generates_frames(self) -> bool:
        return self.mode != "inverse_dynamics"

    def clean_frames(self, temporal_factor: int) -> int:
        """Leading latent frames held clean for a VAE of `temporal_factor`: frame 0, or every
        latent frame of the clip for inverse dynamics."""
        if self.mode == "inverse_dynamics":
            return latent_frames(self.frames, temporal_factor)
        return 1

    def media(self, height: int, width: int, fps: float = DEFAULT_FPS) -> MediaSpec:
        """The clip this condition spans at `height` x `width` pixels and `fps`."""
        return MediaSpec(frames=self.frames, height=int(height), width=int(width), fps=float(fps))

    def normalise(self, row: Sequence[float]) -> tuple[float, ...]:
        """A raw action row -> the model's row (identity without a normalisation)."""
        self._check_row(row)
        if self.offset is None:
            return tuple(float(v) for v in row)
        return tuple((float(v) - o) / s for v, o, s in zip(row, self.offset, self.scale))

    def denormalise(self, row: Sequence[float]) -> tuple[float, ...]:
        """A model's row (its first `width` columns) -> the raw action row."""
        self._check_row(row)
        if self.offset is None:
            return tuple(float(v) for v in row)
        return tuple(float(v) * s + o for v, o, s in zip(row, self.offset, self.scale))

    def _check_row(self, row: Sequence[float]) -> None:
        if len(row) != self.width:
            raise ValueError(f"a {self.embodiment} action row has {self.width} numbers, got {len(row)}")

    def caption(self, description: str, media: MediaSpec) -> str:
        """The structured caption of `description` for a clip of `media` (see `action_caption`)."""
        return action_caption(
            description, view_point=self.view_point, frames=media.frames, fps=media.fps, height=media.height, width=media.width
        )


def action_caption(description: str, *, view_point: str | None, frames: int, fps: float, height: int, width: int) -> str:
    """The JSON caption `Cosmos3OmniPipeline._build_action_json_prompt` builds, character for
    character: the framing sentence of `view_point`, one action spanning the clip with the
    description (a full stop added when it ends without one), duration, fps, resolution, the
    nearest of five aspect ratios. The pipeline names its tier canvas as the resolution (see
    `tier_canvas`); the project names the frame size it generates."""
    if view_point is not None and view_point not in VIEW_POINTS:
        raise ValueError(f"view_point {view_point!r} is not one of {sorted(VIEW_POINTS)} (or None for no framing)")
    seconds = frames / fps if fps > 0 else 0.0
    finite = seconds >= 0 and math.isfinite(seconds)
    duration = int(seconds) if finite else 0
    end = round(seconds) if finite else 0
    minutes, rest = divmod(end, 60)
    text = description.strip()
    if text and not text.endswith((".", "!", "?")):
        text = f"{text}."
    caption: dict = {}
    if view_point is not None:
        caption["cinematography"] = {"framing": VIEW_POINTS[view_point]}
    ratio = width / height if height > 0 else 1.0
    aspect = min(("1,1", "4,3", "3,4", "16,9", "9,16"), key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))
    caption["actions"] = [{"time": f"0:00-{minutes}:{rest:02d}", "description": text}]
    caption["duration"] = f"{duration}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    caption["aspect_ratio"] = aspect
    return json.dumps(caption)


def tier_canvas(height: int, width: int, tier: int) -> tuple[int, int]:
    """(height, width) of the canvas the pipeline pads a `height` x `width` frame into at
    `resolution_tier` `tier` (the bin of nearest height / width ratio), which its caption names."""
    if tier not in RESOLUTION_TIERS:
        raise ValueError(f"resolution tier {tier!r} is not one of {sorted(RESOLUTION_TIERS)}")
    ratio = float(height / width)
    nearest = min(RESOLUTION_TIERS[tier], key=lambda key: abs(key - ratio))
    return RESOLUTION_TIERS[tier][nearest]
