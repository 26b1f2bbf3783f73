"""Push-T's simulator (gym-pusht's `PushTEnv`: pymunk physics, pygame drawing, shapely coverage) as
the ground truth a world model's predictions are judged against.

- The world is 512 x 512 units, y pointing down (pygame's screen = pymunk's space, no flip). The
  agent is a kinematic disc of radius 15; the block is a T of two boxes (120 x 30 bar, 30 x 90
  stem); the goal is the same T at (256, 256), angle pi / 4, drawn under everything.
- An action is the agent's target position in world units ([0, 512]^2; Cosmos3's `pusht`
  embodiment, 2 wide). One step holds it for 1/10 s: ten 0.01 s physics steps under the env's PD
  control (`k_p` = 100, `k_v` = 20), so a clip runs at 10 fps.
- A state is `STATE_FIELDS`: the env's own observation (agent x, y, block x, y, angle) and what
  exact replay also needs: both bodies' velocities and the block's angular velocity. The block's
  angle is the body's raw angle, not wrapped to [0, 2 pi) as the env's observation is: wrapping
  rounds, and a replay from a rounded angle drifts. A fresh simulator set to a state and stepped
  reproduces the original bit for bit while no contact persists across the cut (pymunk keeps
  contact impulses between steps, which a state does not hold); replaying a whole episode from its
  first state, as every verifier here does, is exact always.
- Frames: the env's own drawing at 512 x 512 (`PushTEnv._draw`) resized by its own
  `PushTEnv._get_img` (OpenCV, bilinear) to any size: 96 x 96 is the env's native observation.
  Headless: pygame draws on an off-screen surface, no display is opened.
- Masks: the agent disc and the T drawn alone with the env's own drawing routines (pymunk_override:
  the disc, the filled polygons and their 2-unit outline) in one colour, resized the same way and
  cut at half coverage, so a mask is the set of pixels the rendered object covers at least half of.
- Coverage: `PushTEnv._get_coverage` (the share of the goal T the block covers; the env's reward
  is coverage / 0.95 clipped to 1, success at coverage > 0.95).
"""

from __future__ import annotations

import os
from typing import Sequence, Union

# Headless drawing: pygame is imported by gym_pusht; these must be set before that import.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import pygame  # noqa: E402
from gym_pusht.envs.pusht import PushTEnv  # noqa: E402
from gym_pusht.envs.pymunk_override import DrawOptions, light_color  # noqa: E402
from pymunk.space_debug_draw_options import SpaceDebugColor  # noqa: E402
from pymunk.vec2d import Vec2d  # noqa: E402

WORLD = 512  # world units a side (and the pixels of the env's drawing surface)
NATIVE_SIZE = 96  # the env's observation: 96 x 96 pixels
FPS = 10.0  # steps per second (the env's control_hz)
STATE_FIELDS = (
    "agent_x", "agent_y", "block_x", "block_y", "block_angle",
    "agent_vx", "agent_vy", "block_vx", "block_vy", "block_angular_velocity",
)
STATE_WIDTH = len(STATE_FIELDS)
POSE_WIDTH = 5  # the env's own observation: the first five fields
ACTION_WIDTH = 2  # the agent's target (x, y): Cosmos3's `pusht` embodiment
SUCCESS_COVERAGE = 0.95  # the env's success rule: coverage above this

Size = Union[int, Sequence[int]]

_MASK_COLOUR = SpaceDebugColor(255, 255, 255, 255)  # light_color() of white is white: one-colour masks


def frame_size(size: Size) -> tuple[int, int]:
    """`96` -> (96, 96); `(h, w)` -> (h, w); both sides at least 8 px (a 15-unit disc is ~0.5 px below that)."""
    height, width = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if isinstance(height, bool) or int(height) != height or int(width) != width or min(height, width) < 8:
        raise ValueError(f"a Push-T frame size is an int or (height, width) of at least 8 px, got {size!r}")
    return int(height), int(width)


def world_to_pixel(xy: Sequence[float], size: Size) -> np.ndarray:
    """World (x, y) -> pixel (column, row) at `size`, pixel centres at whole numbers. pygame fills a
    disc centred at world x over drawing pixels round(x) - 15 .. round(x) + 14, so world u sits at
    drawing index u - 0.5; OpenCV's bilinear resize samples output pixel j at input
    (j + 0.5) * 512 / side - 0.5, so u lands at u * side / 512 - 0.5 (a rendered disc's centroid
    agrees to 0.25 px at 96 x 96: the centre's rounding to a drawing pixel and the resampling)."""
    height, width = frame_size(size)
    x, y = float(xy[0]), float(xy[1])
    return np.array([x * width / WORLD - 0.5, y * height / WORLD - 0.5])


def check_state(state: Sequence[float], where: str = "state") -> np.ndarray:
    """A state as float64 [STATE_WIDTH]; a 5-number pose (the env's observation) gets zero velocities."""
    values = np.asarray(state, dtype=np.float64).reshape(-1)
    if values.size == POSE_WIDTH:
        values = np.concatenate([values, np.zeros(STATE_WIDTH - POSE_WIDTH)])
    if values.size != STATE_WIDTH or not np.all(np.isfinite(values)):
        raise ValueError(
            f"{where}: a Push-T state is {POSE_WIDTH} (pose) or {STATE_WIDTH} ({', '.join(STATE_FIELDS)}) finite numbers, "
            f"got {np.asarray(state).shape} {np.asarray(state).reshape(-1)[:STATE_WIDTH].tolist()}"
        )
    return values


def check_actions(actions: np.ndarray, where: str = "actions") -> np.ndarray:
    """Actions as float64 [N, 2], finite (targets outside [0, 512] are allowed: the env does not clip)."""
    values = np.asarray(actions, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] != ACTION_WIDTH or not np.all(np.isfinite(values)):
        raise ValueError(f"{where}: Push-T actions are finite [N, {ACTION_WIDTH}] target positions, got {values.shape}")
    return values


class PushTSim:
    """One Push-T world: `PushTEnv`'s bodies, control and drawing, set to a state and stepped."""

    def __init__(self, state: Sequence[float]):
        self.env = PushTEnv(obs_type="state", render_mode="rgb_array")
        self.env._setup()
        self.set_state(state)

    @staticmethod
    def random_start(seed: int) -> np.ndarray:
        """The env's own start distribution for `seed` (`PushTEnv.reset`: agent in [50, 450)^2, block
        in [100, 400)^2 at any angle, one physics step to settle overlaps), as a state."""
        env = PushTEnv(obs_type="state", render_mode="rgb_array")
        env.reset(seed=int(seed))
        return _read_state(env)

    def set_state(self, state: Sequence[float]) -> None:
        """Set every field of `state` (no physics step, unlike the env's `reset_to_state`). The angle goes
        first: pymunk turns a body about its centre of gravity, which moves the T's origin when the angle
        is set after the position (the env's legacy order, so its `reset_to_state` does not restore)."""
        s = check_state(state)
        env = self.env
        env.agent.position = Vec2d(s[0], s[1])
        env.block.angle = float(s[4])
        env.block.position = Vec2d(s[2], s[3])
        env.agent.velocity = Vec2d(s[5], s[6])
        env.block.velocity = Vec2d(s[7], s[8])
        env.block.angular_velocity = float(s[9])
        # Shapes keep their world position from the last physics step (what pymunk's debug drawing
        # reads); reindexing refreshes it without a step, so a frame drawn now shows this state.
        env.space.reindex_shapes_for_body(env.agent)
        env.space.reindex_shapes_for_body(env.block)

    def state(self) -> np.ndarray:
        """float64 [STATE_WIDTH] in STATE_FIELDS order."""
        return _read_state(self.env)

    def step(self, action: Sequence[float]) -> None:
        """Hold the target `action` for one control step: `PushTEnv.step`'s physics, operation for
        operation (the same arithmetic on the same types, so the same bits), without its reward and
        observation (a test checks the two agree)."""
        env = self.env
        action = np.asarray(action, dtype=np.float64)
        for _ in range(int(1 / (env.dt * env.control_hz))):
            acceleration = env.k_p * (action - env.agent.position) + env.k_v * (Vec2d(0, 0) - env.agent.velocity)
            env.agent.velocity += acceleration * env.dt
            env.space.step(env.dt)

    def coverage(self) -> float:
        """The share of the goal T covered by the block (`PushTEnv._get_coverage`)."""
        return float(self.env._get_coverage())

    def render(self, size: Size = NATIVE_SIZE) -> np.ndarray:
        """uint8 [H, W, 3]: the env's frame at `size` (`_draw` then `_get_img`, no action marker)."""
        height, width = frame_size(size)
        return self.env._get_img(self.env._draw(), width=width, height=height, render_action=False)

    def masks(self, size: Size = NATIVE_SIZE) -> tuple[np.ndarray, np.ndarray]:
        """(agent, block): bool [H, W] masks of the disc and the T at `size` (module docstring)."""
        height, width = frame_size(size)
        env = self.env
        agent = pygame.Surface((WORLD, WORLD))
        agent.fill((0, 0, 0))
        (disc,) = [shape for shape in env.space.shapes if shape.body is env.agent]
        DrawOptions(agent).draw_circle(env.agent.position, env.agent.angle, disc.radius, _MASK_COLOUR, _MASK_COLOUR)
        block = pygame.Surface((WORLD, WORLD))
        block.fill((0, 0, 0))
        options = DrawOptions(block)
        for shape in env.block.shapes:
            verts = [env.block.local_to_world(v) for v in shape.get_vertices()]
            options.draw_polygon(verts, shape.radius, _MASK_COLOUR, _MASK_COLOUR)
        return _cut(agent, width, height), _cut(block, width, height)


def _cut(surface: pygame.Surface, width: int, height: int) -> np.ndarray:
    pixels = np.transpose(np.array(pygame.surfarray.pixels3d(surface)), axes=(1, 0, 2))[..., 0]
    return cv2.resize(pixels, (width, height)) >= 128


def _read_state(env: PushTEnv) -> np.ndarray:
    agent, block = env.agent, env.block
    return np.array(
        [*agent.position, *block.position, block.angle, *agent.velocity, *block.velocity, block.angular_velocity],
        dtype=np.float64,
    )


def palette() -> dict[str, tuple[int, int, int]]:
    """The drawing's colours by part, from the env's own names and its outline rule (`light_color`):
    background, goal, wall, the disc's rim and fill, the T's outline and fill."""
    def rgb(name: str) -> tuple[int, int, int]:
        colour = pygame.Color(name)
        return int(colour.r), int(colour.g), int(colour.b)

    def light(name: str) -> tuple[int, int, int]:
        r, g, b = rgb(name)
        return tuple(int(v) for v in light_color(SpaceDebugColor(r, g, b, 255)).as_int()[:3])

    return {
        "background": (255, 255, 255),  # PushTEnv._draw fills white
        "goal": rgb("LightGreen"),
        "wall": rgb("LightGray"),
        "agent_rim": rgb("RoyalBlue"),
        "agent_fill": light("RoyalBlue"),
        "block_outline": rgb("LightSlateGray"),
        "block_fill": light("LightSlateGray"),
    }


def rollout(state: Sequence[float], actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(states [N + 1, STATE_WIDTH], coverages [N + 1]) from `state` under `actions` [N, 2]."""
    actions = check_actions(actions)
    sim = PushTSim(state)
    states, coverages = [sim.state()], [sim.coverage()]
    for action in actions:
        sim.step(action)
        states.append(sim.state())
        coverages.append(sim.coverage())
    return np.stack(states), np.array(coverages)


def render_states(states: np.ndarray, size: Size = NATIVE_SIZE) -> np.ndarray:
    """uint8 [N, H, W, 3]: each state's frame at `size` (rendering depends on the pose only)."""
    states = np.asarray(states, dtype=np.float64)
    sim = PushTSim(states[0])
    frames = []
    for state in states:
        sim.set_state(state)
        frames.append(sim.render(size))
    return np.stack(frames)


def state_masks(states: np.ndarray, size: Size = NATIVE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(agent, block): bool [N, H, W] masks of each state's disc and T at `size`."""
    states = np.asarray(states, dtype=np.float64)
    sim = PushTSim(states[0])
    agents, blocks = [], []
    for state in states:
        sim.set_state(state)
        agent, block = sim.masks(size)
        agents.append(agent)
        blocks.append(block)
    return np.stack(agents), np.stack(blocks)


def goal_outline(size: Size = NATIVE_SIZE) -> np.ndarray:
    """float64 [K, 2]: the goal T's boundary (the union of its two boxes, `PushTEnv._get_coverage`'s
    goal geometry) as pixel (column, row) points at `size` (`world_to_pixel`), closed (last = first):
    an outline to draw over frames, the model's included."""
    from gym_pusht.envs.pusht import pymunk_to_shapely
    from shapely.ops import unary_union

    env = PushTSim(np.zeros(POSE_WIDTH)).env
    boxes = pymunk_to_shapely(env.get_goal_pose_body(env.goal_pose), env.block.shapes).geoms
    # The boxes only touch along the stem's top edge: grown by a micro-unit (mitred corners, so no
    # new vertices) they merge into one polygon instead of two that share an edge.
    goal = unary_union([box.buffer(1e-6, join_style=2) for box in boxes])
    return np.stack([world_to_pixel(point, size) for point in goal.exterior.coords])


def coverage_of(state: Sequence[float]) -> float:
    """The coverage of one state's block pose."""
    return PushTSim(state).coverage()
