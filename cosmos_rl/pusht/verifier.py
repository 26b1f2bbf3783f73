"""Exact Push-T verifiers: a world model's predictions judged against gym-pusht's simulator.

The API a suite calls (every frame uint8 [F, H, W, 3] at any size; states `sim.STATE_FIELDS`, as an
episode stores them; actions in world units, `episodes.denormalise_actions` of the model's rows):

    verify_dynamics(frames, states, given=1) -> ClipVerdict
        forward dynamics (given=1: frame 0 is the condition) and clip continuation (given=k: the
        first k frames are the condition): every later frame against its true state.
        `.strict` (1.0 when every judged frame passes), `.partial` (the mean per-frame score).
    action_error(predicted, true) -> ActionError
        inverse dynamics: `.world` (mean L2 per row, world units), `.normalised` (the same on the
        model's rows, i.e. world / 256).
    verify_policy(frames, actions, first_state, lead_in=None, given=1) -> PolicyVerdict
        policy: the generated actions executed in the simulator from the true state at the
        window's start (`first_state` then the `lead_in` actions: the episode's own replay, exact);
        `.coverage_start`, `.coverage_end`, `.coverage_change`, `.reward` (the env's: coverage /
        0.95 clipped to 1), `.success`, `.states` (executed), `.video` (the generated frames against
        the executed states, as `verify_dynamics`).
    judge_frame(frame, state) -> FrameVerdict   (one frame; what the others are made of)

A frame is judged by two checks, each worth half its score:

- **agent**: the centroid of the agent-coloured pixels (the disc's rim or fill colour, nearest of
  the drawing's palette and within `COLOUR_TOLERANCE`) lies within `agent_tolerance_px(size)` of
  the true centre mapped to pixels (`sim.world_to_pixel`). The tolerance is half the disc's radius,
  `AGENT_TOLERANCE_UNITS` = 7.5 world units, but never under `AGENT_TOLERANCE_MIN_PX` = 1 pixel:
  1.41 px at 96 x 96 (7.5 x 96 / 512), 3.75 px at 256, and 1 px (16 units, about the disc's
  radius) at 32, where 7.5 units would be 0.47 px. Why the pixel floor: a frame cannot place a
  disc finer than its own grid except through the anti-aliased shading of its rim, and a model's
  frames (a VAE's round trip first of all) do not reproduce that shading exactly; a sub-pixel
  tolerance tests the shading, not the dynamics. One pixel is the finest position every frame
  size can show; at 32 x 32 it still means the shown disc's centre lies inside the true disc.
  The floor binds below 68 px a side (512 / 7.5) and costs discrimination there: a step shorter
  than 1 px (16 units at 32) is not told from standing still. The simulator's own frames sit
  within 0.25 px at 96 (the centre's rounding to a drawing pixel and the bilinear resampling) and
  0.47 px at 32 (they pass the 7.5-unit rule there: docs/studies/2026-12-07-pusht-vae.md);
  while moving, the disc covers 10-65 units a step, so showing the previous or next step's
  position fails at 96 and, for steps over 1 px, at 32. A frame with no agent pixel fails.
- **block**: the IoU of the block-coloured pixels (the T's outline or fill colour, same rule) with
  the true pose's mask (`sim.PushTSim.masks`) is at least `BLOCK_IOU` = 0.7. The simulator's own
  frames score >= 0.93 at 32-256 px a side; a T shifted by 5.3 units (1 px at 96) keeps IoU ~0.8, by
  10.7 units (2 px at 96) drops to 0.6-0.66 (the arms are 30 units wide), so the threshold is a
  world-geometric tolerance of about 8 units at any frame size, matching the agent's 7.5. It has
  no one-pixel floor: a T shifted 1 px at 32 (16 units along the bar) keeps IoU 0.53, too lax.

The palette is the drawing's own (`sim.palette`) without the wall grey: the walls sit in the outer
8 units, where the agent (targets >= 30 units in) and the T never are, and a half-covered pixel of
the T's edge is nearer the wall grey than the T's fill. Wall pixels fall to the background.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from cosmos_rl.pusht.episodes import ACTION_SCALE
from cosmos_rl.pusht.sim import (
    POSE_WIDTH, STATE_WIDTH, SUCCESS_COVERAGE, PushTSim, check_actions, check_state, frame_size, palette, rollout, world_to_pixel,
)

AGENT_TOLERANCE_UNITS = 7.5  # half the disc's radius (15), world units
AGENT_TOLERANCE_MIN_PX = 1.0  # the frame's own grid: no tolerance below one pixel (module docstring)
BLOCK_IOU = 0.7
COLOUR_TOLERANCE = 60.0  # RGB distance to the nearest palette colour beyond which a pixel is nobody's

_PALETTE = {name: rgb for name, rgb in palette().items() if name != "wall"}
_NAMES = list(_PALETTE)
_COLOURS = np.array([_PALETTE[name] for name in _NAMES], dtype=np.float64)
_AGENT = [_NAMES.index("agent_rim"), _NAMES.index("agent_fill")]
_BLOCK = [_NAMES.index("block_outline"), _NAMES.index("block_fill")]


def agent_tolerance_px(size) -> float:
    """The agent check's tolerance in pixels at `size` (the shorter side's scale): 7.5 world units,
    at least one pixel (the module docstring says why)."""
    height, width = frame_size(size)
    return max(AGENT_TOLERANCE_UNITS * min(height, width) / 512, AGENT_TOLERANCE_MIN_PX)


@dataclass(frozen=True)
class FrameVerdict:
    agent_error_px: Optional[float]  # centroid to true centre, pixels; None when no agent pixel is seen
    agent_ok: bool
    block_iou: float
    block_ok: bool

    @property
    def passed(self) -> bool:
        return self.agent_ok and self.block_ok

    @property
    def score(self) -> float:
        return (float(self.agent_ok) + float(self.block_ok)) / 2


@dataclass(frozen=True)
class ClipVerdict:
    frames: tuple[FrameVerdict, ...]  # the judged frames: the clip's frames `given` .. F - 1
    given: int  # leading condition frames, not judged

    @property
    def strict(self) -> float:
        return 1.0 if all(frame.passed for frame in self.frames) else 0.0

    @property
    def partial(self) -> float:
        return float(np.mean([frame.score for frame in self.frames]))

    @property
    def failed(self) -> list[int]:
        """Clip indices of the judged frames that did not pass."""
        return [self.given + i for i, frame in enumerate(self.frames) if not frame.passed]


@dataclass(frozen=True)
class ActionError:
    world: float  # mean L2 per row, world units
    normalised: float  # mean L2 per row on the model's rows


@dataclass(frozen=True, eq=False)  # holds an array: no field-wise ==
class PolicyVerdict:
    states: np.ndarray  # float64 [chunk + 1, 10]: the executed states from the window's start
    coverage_start: float
    coverage_end: float
    video: ClipVerdict

    @property
    def coverage_change(self) -> float:
        return self.coverage_end - self.coverage_start

    @property
    def reward(self) -> float:
        """The env's reward at the end: coverage / 0.95 clipped to [0, 1]."""
        return float(np.clip(self.coverage_end / SUCCESS_COVERAGE, 0.0, 1.0))

    @property
    def success(self) -> bool:
        return self.coverage_end > SUCCESS_COVERAGE


def _check_frames(frames: np.ndarray, where: str) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"{where}: Push-T frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    frame_size(frames.shape[1:3])
    return frames


def colour_masks(frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(agent, block): bool [H, W] pixels of the agent's and the T's colours (module docstring)."""
    pixels = frame.astype(np.float64)
    distance = ((pixels[..., None, :] - _COLOURS) ** 2).sum(-1)
    nearest = distance.argmin(-1)
    close = np.sqrt(distance.min(-1)) <= COLOUR_TOLERANCE
    return np.isin(nearest, _AGENT) & close, np.isin(nearest, _BLOCK) & close


def _judge(frame: np.ndarray, sim: PushTSim, state: np.ndarray) -> FrameVerdict:
    size = frame.shape[:2]
    sim.set_state(state)
    _, true_block = sim.masks(size)
    agent, block = colour_masks(frame)
    rows, cols = np.nonzero(agent)
    if rows.size:
        centre = world_to_pixel(state[0:2], size)
        error = float(np.hypot(cols.mean() - centre[0], rows.mean() - centre[1]))
        agent_ok = error <= agent_tolerance_px(size)
    else:
        error, agent_ok = None, False
    union = int((block | true_block).sum())
    iou = float((block & true_block).sum() / union) if union else 1.0
    return FrameVerdict(agent_error_px=error, agent_ok=agent_ok, block_iou=iou, block_ok=iou >= BLOCK_IOU)


def judge_frame(frame: np.ndarray, state: Sequence[float]) -> FrameVerdict:
    """One uint8 [H, W, 3] frame against one state."""
    frames = _check_frames(np.asarray(frame)[None], "frame")
    state = check_state(state)
    return _judge(frames[0], PushTSim(state), state)


def verify_dynamics(frames: np.ndarray, states: np.ndarray, given: int = 1) -> ClipVerdict:
    """Frames `given` .. F - 1 of a predicted clip, each against the true state of its index."""
    frames = _check_frames(frames, "predicted clip")
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 2 or states.shape[0] != frames.shape[0] or states.shape[1] < POSE_WIDTH:
        raise ValueError(f"states must be [F={frames.shape[0]}, >= {POSE_WIDTH}] beside the frames, got {states.shape}")
    if not 0 <= given < frames.shape[0]:
        raise ValueError(f"given (condition frames) must be in [0, {frames.shape[0]}), got {given}")
    width = STATE_WIDTH if states.shape[1] >= STATE_WIDTH else POSE_WIDTH  # rendering needs the pose only
    checked = [check_state(state[:width], f"state {i}") for i, state in enumerate(states)]
    sim = PushTSim(checked[0])
    return ClipVerdict(frames=tuple(_judge(frames[i], sim, checked[i]) for i in range(given, len(frames))), given=int(given))


def action_error(predicted: np.ndarray, true: np.ndarray) -> ActionError:
    """Mean L2 per row between predicted and true actions [N, 2], in world units and on the model's rows."""
    predicted, true = check_actions(predicted, "predicted actions"), check_actions(true, "true actions")
    if predicted.shape != true.shape:
        raise ValueError(f"predicted actions {predicted.shape} and true actions {true.shape} differ in shape")
    gap = predicted - true
    world = float(np.mean(np.hypot(gap[:, 0], gap[:, 1])))
    rows = gap / np.array(ACTION_SCALE)
    return ActionError(world=world, normalised=float(np.mean(np.hypot(rows[:, 0], rows[:, 1]))))


def verify_policy(frames: np.ndarray, actions: np.ndarray, first_state: Sequence[float],
                  lead_in: Optional[np.ndarray] = None, given: int = 1) -> PolicyVerdict:
    """Execute `actions` [chunk, 2] from the window's true start (`first_state`, the episode's state 0,
    advanced by the `lead_in` actions the episode took before the window), then judge the generated
    `frames` [chunk + 1, H, W, 3] against the executed states."""
    actions = check_actions(actions, "generated actions")
    frames = _check_frames(frames, "generated clip")
    if frames.shape[0] != actions.shape[0] + 1:
        raise ValueError(f"a policy clip has one frame more than its actions: {frames.shape[0]} frames, {actions.shape[0]} actions")
    start = check_state(first_state, "first_state")
    if lead_in is not None and len(lead_in):
        start = rollout(start, check_actions(lead_in, "lead_in actions"))[0][-1]
    states, coverages = rollout(start, actions)
    return PolicyVerdict(
        states=states, coverage_start=float(coverages[0]), coverage_end=float(coverages[-1]),
        video=verify_dynamics(frames, states, given),
    )
