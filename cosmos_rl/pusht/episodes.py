"""Push-T episodes made on the simulator, as `cosmos_rl.data.episodes.Episode` values.

Two makers, both seeded and deterministic (the same seed gives the same episode, bit for bit, in
any process: numpy's PCG64 on the seed, pymunk's physics single-threaded):

- `planner_episode`: model-predictive control toward higher coverage. Every `replan` steps it
  draws `candidates` action chunks of `horizon` targets, rolls each out on a copy of the world set
  to the current state, and executes the first `replan` targets of the best chunk plus Gaussian
  noise (`noise` world units: the diversity between episodes of one start). A chunk is scored by
  coverage at its end, with two shaping terms while coverage is low (0 for most starts, so
  coverage alone ranks nothing): the block's distance to the goal pose and the agent's distance
  to the block. Candidates: half are the agent's target placed behind the block (pushing it
  towards the goal, jittered), half drawn around the last plan (random shooting, one CEM-like
  refinement: the best chunk of the previous replan, shifted and perturbed).
- `random_episode`: smooth random targets: waypoints drawn every few steps (half uniform over the
  arena, half near the block, so the agent touches it often) joined by straight lines.

Targets stay in [`MARGIN`, 512 - `MARGIN`]^2 so the whole disc stays inside the frame (the agent
is kinematic: the walls do not stop it, and a half-seen disc would bias its centroid).

Row t of an episode is (frame t, the state at t, the action taken at t), as LeRobot stores them:
an episode of T frames steps T - 1 times; its last action is planned but not executed. States are
`sim.STATE_FIELDS` (10 numbers, velocities included); `states[0]` and the actions replay the
whole episode exactly (`sim.rollout`).

**Action normalisation** (the model's rows, `ActionSpec.offset` / `scale`): a target in world
units [0, 512] maps to [-1, 1] as (target - 256) / 256, both columns (the convention of
tests/test_world_model_parity.py). `action_spec` builds that `ActionSpec`.

Speed (this project's 2-core CPU machine, one thread, 50 frames at 96 x 96): a planner episode
takes about 0.7 s (8 candidates x 6 steps per 3 executed steps), a random one about 0.2 s (mostly
drawing); `make_episodes(100, seed, frames=50)` (half each) took 72 s with the machine shared
(load ~5), about 45 s by the per-episode figures. The planner raises coverage in about 6 starts of
10 within 50 frames (to 0.4-0.5 typically) and moves the block in all.
"""

from __future__ import annotations

import numpy as np

from cosmos_rl.core.actions import ActionSpec
from cosmos_rl.data.episodes import Episode
from cosmos_rl.pusht.sim import FPS, NATIVE_SIZE, WORLD, PushTSim, Size, render_states

ACTION_OFFSET = (256.0, 256.0)  # world units: the arena's centre -> 0
ACTION_SCALE = (256.0, 256.0)  # half the arena -> 1
MARGIN = 30.0  # world units kept between a target and the frame's edge (the disc's radius is 15)
TASK = "Push the T-shaped block onto the T-shaped target."
GOAL = np.array([256.0, 256.0, np.pi / 4])  # the env's goal pose (x, y, angle)


def action_spec(mode: str, chunk: int, view_point: str | None = "ego_view") -> ActionSpec:
    """The `pusht` action condition with this module's normalisation."""
    return ActionSpec(mode=mode, embodiment="pusht", chunk=chunk, view_point=view_point, offset=ACTION_OFFSET, scale=ACTION_SCALE)


def normalise_actions(actions: np.ndarray) -> np.ndarray:
    """World-unit targets [..., 2] -> the model's rows: (a - 256) / 256."""
    return (np.asarray(actions, dtype=np.float64) - np.array(ACTION_OFFSET)) / np.array(ACTION_SCALE)


def denormalise_actions(rows: np.ndarray) -> np.ndarray:
    """The model's rows [..., 2] -> world-unit targets: row * 256 + 256."""
    return np.asarray(rows, dtype=np.float64) * np.array(ACTION_SCALE) + np.array(ACTION_OFFSET)


def _clip(targets: np.ndarray) -> np.ndarray:
    return np.clip(targets, MARGIN, WORLD - MARGIN)


def _angle_gap(a: float, b: float) -> float:
    """|a - b| for the T, whose pose repeats every 2 pi."""
    return abs((a - b + np.pi) % (2 * np.pi) - np.pi)


def _plan_cost(sim: PushTSim) -> float:
    """Lower is better: -coverage, plus (while coverage is under a half) the block's distance to the
    goal pose (100 units per radian) and the agent's distance to the block, both per 512 units."""
    state = sim.state()
    coverage = sim.coverage()
    cost = -10.0 * coverage
    if coverage < 0.5:
        block_gap = np.hypot(*(state[2:4] - GOAL[:2])) + 100.0 * _angle_gap(state[4], GOAL[2])
        reach = np.hypot(*(state[0:2] - state[2:4]))
        cost += block_gap / WORLD + 0.3 * reach / WORLD
    return float(cost)


def _pushes(state: np.ndarray, rng: np.random.Generator, count: int, horizon: int) -> np.ndarray:
    """`count` chunks that go behind the block (opposite the goal) then through it towards the goal."""
    block, toward = state[2:4], GOAL[:2] - state[2:4]
    direction = toward / max(np.hypot(*toward), 1e-6)
    chunks = np.empty((count, horizon, 2))
    for i in range(count):
        behind = block - direction * rng.uniform(40, 90) + rng.normal(0, 25, 2)
        through = block + direction * rng.uniform(0, 60) + rng.normal(0, 25, 2)
        turn = max(1, int(rng.integers(1, horizon)))
        ramp = np.linspace(0, 1, horizon - turn + 1)[1:, None]
        chunks[i, :turn] = behind
        chunks[i, turn:] = behind + ramp * (through - behind)
    return _clip(chunks)


def plan_actions(start: np.ndarray, steps: int, seed: int, *, horizon: int = 6, candidates: int = 8,
                 replan: int = 3, noise: float = 8.0) -> np.ndarray:
    """float64 [steps, 2]: the planner's targets from `start` (module docstring), deterministic in `seed`."""
    rng = np.random.default_rng([int(seed), 1])
    sim = PushTSim(start)
    scratch = PushTSim(start)
    previous = None
    actions: list[np.ndarray] = []
    while len(actions) < steps:
        state = sim.state()
        pool = [_pushes(state, rng, candidates - candidates // 2, horizon)]
        if previous is not None:
            shifted = np.concatenate([previous[replan:], np.repeat(previous[-1:], replan, axis=0)])
            pool.append(_clip(shifted[None] + rng.normal(0, 20, (candidates // 2, horizon, 2))))
        else:
            pool.append(_clip(state[0:2] + rng.normal(0, 60, (candidates // 2, horizon, 2))))
        chunks = np.concatenate(pool)
        costs = []
        for chunk in chunks:
            scratch.set_state(state)
            for target in chunk:
                scratch.step(target)
            costs.append(_plan_cost(scratch))
        previous = chunks[int(np.argmin(costs))]
        for target in previous[:replan]:
            if len(actions) == steps:
                break
            action = _clip(target + rng.normal(0, noise, 2))
            actions.append(action)
            sim.step(action)
    return np.stack(actions)


def random_actions(start: np.ndarray, steps: int, seed: int, *, every: int = 5) -> np.ndarray:
    """float64 [steps, 2]: smooth random targets from `start`: a waypoint every `every` steps (half
    uniform over the arena, half within 60 units of the block's start), joined by straight lines
    starting at the agent's own position."""
    rng = np.random.default_rng([int(seed), 2])
    start = np.asarray(start, dtype=np.float64)
    points = [start[0:2]]
    for _ in range(steps // every + 1):
        if rng.random() < 0.5:
            points.append(rng.uniform(MARGIN, WORLD - MARGIN, 2))
        else:
            points.append(start[2:4] + rng.normal(0, 60, 2))
    points = _clip(np.stack(points))
    t = np.arange(1, steps + 1) / every  # the first target is already a step along the first segment
    segment = np.minimum(t.astype(int), len(points) - 2)
    frac = (t - segment)[:, None]
    return points[segment] + frac * (points[segment + 1] - points[segment])


def make_episode(index: int, start: np.ndarray, actions: np.ndarray, size: Size = NATIVE_SIZE, task: str = TASK) -> Episode:
    """The episode of `len(actions)` frames from `start`: actions 0 .. T - 2 executed, frames rendered at `size`.
    The actions are rounded to float32 (an episode's action dtype) before they run, so the stored
    actions replay the stored states bit for bit."""
    actions = np.asarray(actions, dtype=np.float32)
    sim = PushTSim(start)
    states = [sim.state()]
    for action in actions[:-1]:
        sim.step(action.astype(np.float64))
        states.append(sim.state())
    states = np.stack(states)
    return Episode(
        index=int(index), frames=render_states(states, size), actions=actions,
        states=states, task=task, fps=FPS,
    )


def planner_episode(index: int, seed: int, frames: int = 50, size: Size = NATIVE_SIZE, **planner) -> Episode:
    """A planner episode of `frames` frames from the env's start for `seed` (`PushTSim.random_start`)."""
    start = PushTSim.random_start(seed)
    return make_episode(index, start, plan_actions(start, frames, seed, **planner), size)


def random_episode(index: int, seed: int, frames: int = 50, size: Size = NATIVE_SIZE, every: int = 5) -> Episode:
    """A random-action episode of `frames` frames from the env's start for `seed`."""
    start = PushTSim.random_start(seed)
    return make_episode(index, start, random_actions(start, frames, seed, every=every), size)


def make_episodes(count: int, seed: int, frames: int = 50, size: Size = NATIVE_SIZE, random_share: float = 0.5) -> list[Episode]:
    """`count` episodes, indexed 0 .. count - 1: the first round(count * (1 - random_share)) from the
    planner, the rest random; episode i starts from the env's start for seed (seed, i)."""
    if count < 0 or not 0.0 <= random_share <= 1.0:
        raise ValueError(f"make_episodes needs count >= 0 and random_share in [0, 1], got {count}, {random_share}")
    planned = round(count * (1.0 - random_share))
    episodes = []
    for i in range(count):
        episode_seed = int(np.random.SeedSequence([int(seed), i]).generate_state(1)[0])
        maker = planner_episode if i < planned else random_episode
        episodes.append(maker(i, episode_seed, frames, size))
    return episodes
