"""Fast checks of the NFT step's seeding and prompt order (no Ray, no model)."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos_rl.config import load
from cosmos_rl.data.prompts import PromptCursor
from cosmos_rl.core.seeds import derive_seed
from cosmos_rl.trainers.nft import rollout_noise

SMOKE = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"
CPU = torch.device("cpu")


def _noise(rank: int, clock: str, rows: int, step: int) -> torch.Tensor:
    config = load.load(SMOKE, [f'rl.rollout_seed_clock="{clock}"', f"rl.prompts_per_step={rows}"])
    return rollout_noise(config.rl, config.job.seed, rank, step, (4, 8, 8), CPU)


def test_source_row_clock_gives_the_nth_row_the_same_noise_however_rows_are_grouped():
    two_per_step = _noise(0, "source_row", 2, step=2)  # rows 2 and 3 of the run
    assert torch.equal(two_per_step[0], _noise(0, "source_row", 1, step=3)[0])
    assert torch.equal(two_per_step[1], _noise(0, "source_row", 1, step=4)[0])
    assert not torch.equal(two_per_step[0], two_per_step[1])


def test_step_clock_and_ranks_draw_different_noise_and_reruns_the_same():
    row = _noise(0, "source_row", 2, step=1)
    step = _noise(0, "optimizer_step", 2, step=1)
    other_rank = _noise(1, "source_row", 2, step=1)
    assert not torch.equal(row, step) and not torch.equal(row, other_rank)
    assert torch.equal(row, _noise(0, "source_row", 2, step=1))
    assert derive_seed(0, "train", 1, 5) != derive_seed(0, "train", 1, 6)


def test_unshuffled_prompt_cursor_walks_the_file_in_order_every_epoch():
    cursor = PromptCursor(3, 2, seed=0, shuffle=False)
    rows = [row for _ in range(3) for row, _ in cursor.next_batch(["a", "b", "c"])]
    assert rows == [0, 1, 2, 0, 1, 2]
