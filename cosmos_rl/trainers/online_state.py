"""The seed contract an NFT checkpoint records in its `meta.json`, and the resume check against it.

Kept apart from the worker (and torch-free) so the driver can check a resume, which only reads
`meta.json`, without importing the model stack. The weights are saved as every trainer saves them
(`checkpoint.policy`).
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.planning import plan
from cosmos_rl.checkpoint import layout
from cosmos_rl.core import schema
from cosmos_rl.core.errors import UserError

SEED_CONTRACT_KEY = "seed_contract"
# What a rank's train_step returns when another rank's reward call failed for good (OnlineTrainer.train_step).
REWARD_FAILED = "reward_failed"


def contract_changes(saved: dict, current: dict) -> list[str]:
    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


def check_seed_contract(config: schema.RunConfig, run_dir: Path) -> int:
    """The newest committed step, after refusing a checkpoint whose seed contract differs from the run's.

    Reads only `meta.json`, so it runs before Ray starts and before any cursor moves.
    """
    root = layout.checkpoints_root(run_dir)
    step = layout.latest_committed(root)
    if step is None:
        raise UserError(f"{run_dir}: no committed checkpoint to resume from; start it again with `cosmos-rl train`")
    saved = layout.read_meta(root, step).get("extra", {}).get(SEED_CONTRACT_KEY)
    if saved is None:
        raise UserError(f"{layout.step_dir(root, step)}: meta.json records no seed contract; it was not written by the NFT trainer")
    changes = contract_changes(saved, plan.seed_contract(config))
    if changes:
        raise UserError(
            f"{run_dir}: the seed contract changed since checkpoint step {step} ({'; '.join(changes)}); "
            "an exact resume would continue under different sampling - restore the run's values in "
            f"{run_dir / 'manifest.toml'} or start a new run"
        )
    return step
