"""The simulator's reward of one generated action chunk (policy-mode online training, the reward
`pusht_chunk_coverage`): the coverage change the chunk's actions cause when executed from the true
state of the window a key names. Torch-free.

The window's first state is restored exactly as every verifier here restores it: one `PushTSim` set
to the episode's state 0 steps the episode's own actions before the window (`lead_in`), then the
generated actions, so the simulator is the one that made the episode, contacts included (a fresh
simulator set to the window's state would drop pymunk's persisted contact impulses). The reward is
`closed_loop.chunk_rewards` of those steps: coverage after the last executed action minus coverage
at the window's start. As the env (and the closed loop) does, stepping stops at the first step whose
coverage passes `SUCCESS_COVERAGE` (`PushTEnv.step` terminates there).

The change is rounded to `DECIMALS` places: the env's coverage (shapely's intersection area) moves
by an ulp from call to call on one state (`closed_loop`'s docstring), and a reward that differed in
its last bit between a run and its resumed twin would move their advantages, and so their weights,
apart (`resume --exact` compares them bit for bit).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from cosmos_rl.pusht.closed_loop import chunk_rewards
from cosmos_rl.pusht.sim import SUCCESS_COVERAGE, PushTSim, check_actions, check_state

DECIMALS = 12  # far below any change a step makes, far above the coverage's call-to-call ulp (~1e-16)


def chunk_coverage_change(first_state: Sequence[float], lead_in: np.ndarray, actions: np.ndarray) -> float:
    """Coverage change of `actions` [n >= 1, 2] (world units) executed after `lead_in` [k, 2] from
    the episode's `first_state` (module docstring)."""
    generated = check_actions(actions, "generated actions")
    if len(generated) < 1:
        raise ValueError("generated actions: a chunk executes at least one action, got none")
    sim = PushTSim(check_state(first_state, "first_state"))
    for action in check_actions(np.asarray(lead_in, dtype=np.float64).reshape(-1, 2), "lead_in actions"):
        sim.step(action)
    coverages = [sim.coverage()]
    for action in generated:
        sim.step(action)
        coverages.append(sim.coverage())
        if coverages[-1] > SUCCESS_COVERAGE:
            break
    return round(float(chunk_rewards(coverages, [len(coverages) - 1])[0]), DECIMALS)
