"""The per_role data actor (as a plain object, no Ray): each step's per-rank batches are the pairs a
rank's own PairCursor would pick, repeated asks for a step do not advance it, and its cursor state
round-trips (that state is what a per_role checkpoint saves and a resume pushes back)."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos_rl.config import load
from cosmos_rl.data.cursor import PairCursor
from cosmos_rl.trainers.dpo_data_actor import DPODataActor

MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "dpo_t2i_smoke.toml"

OVERRIDES = ["rl.pairs_per_step=4", "rl.data.synthetic_pairs=6", 'grid.backend="ray"', 'grid.grouping="per_role"']


def _same(a, b) -> bool:
    return a.prompt == b.prompt and torch.equal(a.winner, b.winner) and torch.equal(a.loser, b.loser)


def test_batches_match_each_ranks_cursor_and_repeat_within_a_step():
    config = load.load(MANIFEST, OVERRIDES)
    actor = DPODataActor(config, 2)
    cursors = [PairCursor(len(actor.source), 4, config.job.seed, 2, rank) for rank in range(2)]
    for step in (1, 2, 3):  # 6 pairs, 4 per step: step 2 crosses an epoch boundary
        batches = [actor.next_batch(step, rank) for rank in range(2)]  # the second ask must not advance the cursor
        for rank, cursor in enumerate(cursors):
            expected = [actor.source[i] for i in cursor.next_batch()]
            assert len(batches[rank]) == 2 and all(_same(a, b) for a, b in zip(batches[rank], expected))
    assert actor.cursor_state()["step"] == 3

    resumed = DPODataActor(config, 2)
    resumed.load_cursor(DPODataActor(config, 2).cursor_state() | {"step": 2})
    assert all(_same(a, b) for a, b in zip(resumed.next_batch(3, 1), batches[1]))
