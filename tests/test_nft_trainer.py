"""Fast checks of the NFT worker's seeding and prompt order (no Ray, no model)."""

from __future__ import annotations

from pathlib import Path

import torch

from cosmos_rl.config import load
from cosmos_rl.data.prompts import PromptCursor
from cosmos_rl.seeds import derive_seed
from cosmos_rl.trainers.nft import NFTWorker

SMOKE = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"


def _worker(rank: int, clock: str, rows: int) -> NFTWorker:
    config = load.load(SMOKE, [f'rl.rollout_seed_clock="{clock}"', f"rl.prompts_per_step={rows}"])
    worker = NFTWorker.__new__(NFTWorker)  # only the seeding state; no model, no process group
    worker.rank, worker.config, worker.rl = rank, config, config.rl
    worker.latent_shape, worker.device = (4, 8, 8), torch.device("cpu")
    return worker


def test_source_row_clock_gives_the_nth_row_the_same_noise_however_rows_are_grouped():
    two_per_step = _worker(0, "source_row", 2)._rollout_noise(step=2)  # rows 2 and 3 of the run
    one_per_step = _worker(0, "source_row", 1)
    assert torch.equal(two_per_step[0], one_per_step._rollout_noise(step=3)[0])
    assert torch.equal(two_per_step[1], one_per_step._rollout_noise(step=4)[0])
    assert not torch.equal(two_per_step[0], two_per_step[1])


def test_step_clock_and_ranks_draw_different_noise_and_reruns_the_same():
    row = _worker(0, "source_row", 2)._rollout_noise(step=1)
    step = _worker(0, "optimizer_step", 2)._rollout_noise(step=1)
    other_rank = _worker(1, "source_row", 2)._rollout_noise(step=1)
    assert not torch.equal(row, step) and not torch.equal(row, other_rank)
    assert torch.equal(row, _worker(0, "source_row", 2)._rollout_noise(step=1))
    assert derive_seed(0, "train", 1, 5) != derive_seed(0, "train", 1, 6)


def test_unshuffled_prompt_cursor_walks_the_file_in_order_every_epoch():
    cursor = PromptCursor(3, 2, seed=0, shuffle=False)
    rows = [row for _ in range(3) for row, _ in cursor.next_batch(["a", "b", "c"])]
    assert rows == [0, 1, 2, 0, 1, 2]
