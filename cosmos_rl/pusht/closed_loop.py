"""Closed-loop Push-T: a policy acts in the simulator, receding horizon (as Diffusion Policy runs),
and the rewards the simulator gives it. Torch-free: the policy is any callable.

The loop (`run_closed_loop`): every episode starts from its state in its own `PushTSim`; at chunk k
each episode still running shows the policy its current frame (`PushTSim.render` at the run's
size), the policy returns an action chunk (world units, [chunk, 2]) and the clip it expects
([chunk + 1, H, W, 3], frame 0 the frame it was shown), the first `execute` actions are stepped in
the simulator, and the episode goes on from the state they reached. An episode ends when it has
taken `max_steps` steps or its coverage passes `SUCCESS_COVERAGE` (the env's own rule:
`PushTEnv.step` terminates there, mid-chunk when it comes mid-chunk). One simulator steps the
whole episode, so replaying the executed actions from the start (`sim.rollout`) gives the recorded
states bit for bit, and the coverages to ~1e-15: the env's coverage (shapely's intersection area)
is not bit-stable between calls on one state (it moves by an ulp from call to call in one
process). All episodes still running are shown to the policy together (one batch per chunk
index); the policy is told which episodes and which chunk index, so a sampler can draw each
chunk's noise from (seed, episode, chunk index) whatever else is in the batch.

The rewards (plain functions of the recorded coverages):
- per chunk, `chunk_rewards`: the coverage change the chunk's executed actions caused (coverage
  after its last executed step minus coverage when it was generated);
- per episode, `episode_outcome`: success (some step's coverage above `SUCCESS_COVERAGE`), the
  final coverage and the max coverage over the steps taken (Diffusion Policy's Push-T figure is
  the max over the episode).

Held-out initial states (`held_out_starts`): the env's own start distribution (`PushTSim.random_start`)
for seeds drawn from (`HELD_OUT_SEED`, `START_STREAM`, i): the held-out split's seed, in a stream
of its own beside the held-out episodes' makers (0 planner, 1 random), so no training key reaches
them (`windows.parse_key` refuses that seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from cosmos_rl.pusht.sim import ACTION_WIDTH, SUCCESS_COVERAGE, PushTSim, check_actions, check_state, frame_size
from cosmos_rl.pusht.windows import HELD_OUT_SEED

START_STREAM = 2  # held-out closed-loop starts: after the held-out episodes' makers (0 planner, 1 random)

# frames [N, H, W, 3] uint8 of the running episodes, the chunk index, the episodes' numbers ->
# (actions [N, chunk, 2] world units, clips [N, chunk + 1, H, W, 3] uint8)
Policy = Callable[[np.ndarray, int, Sequence[int]], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, eq=False)  # holds arrays: no field-wise ==
class LoopChunk:
    step: int  # the episode's step count when the chunk was generated (its frame 0 is that step's frame)
    actions: np.ndarray  # float64 [chunk, 2]: every action the policy generated, world units
    predicted: np.ndarray  # uint8 [chunk + 1, H, W, 3]: the clip the policy expected
    executed: int  # the leading actions stepped: `execute`, fewer when the budget ran out or it succeeded


@dataclass(frozen=True, eq=False)
class LoopEpisode:
    start: np.ndarray  # float64 [10]: the initial state
    chunks: tuple[LoopChunk, ...]
    states: np.ndarray  # float64 [steps + 1, 10]: the initial state, then after every step
    coverages: np.ndarray  # float64 [steps + 1]
    frames: np.ndarray  # uint8 [steps + 1, H, W, 3]: the environment's frames

    @property
    def steps(self) -> int:
        return len(self.states) - 1

    @property
    def executed_actions(self) -> np.ndarray:
        """float64 [steps, 2]: the actions stepped, in order (each chunk's leading `executed`)."""
        return np.concatenate([chunk.actions[: chunk.executed] for chunk in self.chunks])

    @property
    def outcome(self) -> "EpisodeOutcome":
        return episode_outcome(self.coverages)

    @property
    def rewards(self) -> np.ndarray:
        return chunk_rewards(self.coverages, [chunk.executed for chunk in self.chunks])

    def predicted_timeline(self) -> np.ndarray:
        """uint8 [steps + 1, H, W, 3]: beside each environment frame, the frame the policy predicted
        for that step (from the chunk that covered it; a chunk's frame 0 is its reading of the frame
        it was shown). The last frame of a finished episode comes from its last chunk."""
        out = []
        for chunk in self.chunks:
            out.extend(chunk.predicted[: chunk.executed])
        last = self.chunks[-1]
        out.append(last.predicted[last.executed])
        return np.stack(out)


@dataclass(frozen=True)
class EpisodeOutcome:
    success: bool
    final_coverage: float
    max_coverage: float
    steps: int


def episode_outcome(coverages: Sequence[float]) -> EpisodeOutcome:
    """An episode's outcome from its coverages [steps + 1] (the initial state's first): success when
    a step's coverage passes `SUCCESS_COVERAGE`; the max over the steps taken (the initial state's
    coverage is nothing the policy did)."""
    values = np.asarray(coverages, dtype=np.float64)
    if values.ndim != 1 or values.size < 2:
        raise ValueError(f"an episode's coverages are the initial state's and one per step (at least one step), got shape {values.shape}")
    stepped = values[1:]
    return EpisodeOutcome(success=bool((stepped > SUCCESS_COVERAGE).any()), final_coverage=float(values[-1]),
                          max_coverage=float(stepped.max()), steps=int(stepped.size))  # fmt: skip


def chunk_rewards(coverages: Sequence[float], executed: Sequence[int]) -> np.ndarray:
    """float64 [chunks]: each chunk's coverage change, the chunks having stepped `executed[k]` steps
    in order over the episode's coverages [steps + 1]."""
    values = np.asarray(coverages, dtype=np.float64)
    counts = [int(n) for n in executed]
    if any(n < 1 for n in counts) or sum(counts) != values.size - 1:
        raise ValueError(f"chunks stepping {counts} steps do not cover an episode of {values.size - 1} steps")
    ends = np.cumsum([0, *counts])
    return values[ends[1:]] - values[ends[:-1]]


def held_out_starts(count: int) -> np.ndarray:
    """float64 [count, 10]: the held-out initial states (module docstring); a larger count keeps the
    earlier states."""
    if count < 1:
        raise ValueError(f"need at least one initial state, got {count}")
    seeds = [int(np.random.SeedSequence([HELD_OUT_SEED, START_STREAM, i]).generate_state(1)[0]) for i in range(count)]
    return np.stack([PushTSim.random_start(seed) for seed in seeds])


def check_loop(chunk: int, execute: int, max_steps: int) -> None:
    """ValueError unless 1 <= execute <= chunk and max_steps >= 1."""
    if not 1 <= execute <= chunk:
        raise ValueError(f"execute must be in [1, {chunk}] (the chunk's actions), got {execute}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")


def run_closed_loop(starts: Sequence[Sequence[float]], policy: Policy, *, chunk: int, execute: int, max_steps: int,
                    size) -> list[LoopEpisode]:  # fmt: skip
    """One episode per initial state in `starts` (module docstring), `execute` of every `chunk`
    actions stepped, to `max_steps` steps or success; frames at `size`."""
    check_loop(chunk, execute, max_steps)
    height, width = frame_size(size)
    sims = [PushTSim(check_state(state, f"initial state {i}")) for i, state in enumerate(starts)]
    states = [[sim.state()] for sim in sims]
    coverages = [[sim.coverage()] for sim in sims]
    frames = [[sim.render((height, width))] for sim in sims]
    chunks: list[list[LoopChunk]] = [[] for _ in sims]
    running = list(range(len(sims)))
    index = 0
    while running:
        shown = np.stack([frames[e][-1] for e in running])
        actions, clips = policy(shown, index, list(running))
        actions = np.asarray(actions, dtype=np.float64)
        clips = np.asarray(clips)
        if actions.shape != (len(running), chunk, ACTION_WIDTH) or clips.shape != (len(running), chunk + 1, height, width, 3):
            raise ValueError(f"the policy returned actions {actions.shape} and clips {clips.shape} for {len(running)} episodes; "
                             f"expected [{len(running)}, {chunk}, {ACTION_WIDTH}] and [{len(running)}, {chunk + 1}, {height}, {width}, 3]")  # fmt: skip
        still = []
        for k, e in enumerate(running):
            sim, taken = sims[e], len(states[e]) - 1
            generated = check_actions(actions[k], f"episode {e} chunk {index} actions")
            executed, done = 0, False
            for action in generated[: min(execute, max_steps - taken)]:
                sim.step(action)
                executed += 1
                states[e].append(sim.state())
                coverages[e].append(sim.coverage())
                frames[e].append(sim.render((height, width)))
                if coverages[e][-1] > SUCCESS_COVERAGE:
                    done = True
                    break
            chunks[e].append(LoopChunk(step=taken, actions=generated, predicted=clips[k].astype(np.uint8), executed=executed))
            if not done and len(states[e]) - 1 < max_steps:
                still.append(e)
        running = still
        index += 1
    return [
        LoopEpisode(start=np.asarray(states[e][0]), chunks=tuple(chunks[e]), states=np.stack(states[e]),
                    coverages=np.array(coverages[e]), frames=np.stack(frames[e]))  # fmt: skip
        for e in range(len(sims))
    ]
