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
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from cosmos_rl.pusht.closed_loop import chunk_rewards
from cosmos_rl.pusht.sim import SUCCESS_COVERAGE, PushTSim, check_actions, check_state


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
    return float(chunk_rewards(coverages, [len(coverages) - 1])[0])
