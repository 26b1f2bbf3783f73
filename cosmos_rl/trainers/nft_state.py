"""What an NFT checkpoint holds beyond the generic components, and the seed-contract check.

Kept apart from the worker so the driver can check a resume (which only reads `meta.json`) without
importing the model stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_rl import plan
from cosmos_rl.checkpoint import layout
from cosmos_rl.config import schema
from cosmos_rl.errors import UserError

SEED_CONTRACT_KEY = "seed_contract"


class AdapterState(Stateful):
    """One named LoRA adapter's tensors (DTensor shards under FSDP2), keyed without the adapter name.

    The policy and the moving old policy are two adapters of one network; saving each under its own
    component keeps them apart (the public codebases lose the old one or overwrite it with the EMA).
    """

    def __init__(self, transformer: torch.nn.Module, adapter: str):
        self.transformer = transformer
        self.adapter = adapter

    def _live(self) -> dict[str, torch.Tensor]:
        from cosmos_rl.models.lora import adapter_tensors

        return adapter_tensors(self.transformer, self.adapter)

    def state_dict(self) -> dict[str, Any]:
        # detach() shares storage, so DCP's in-place load writes straight into the parameters.
        return {key: param.detach() for key, param in self._live().items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        live = self._live()
        if set(live) != set(state_dict):
            missing, extra = sorted(set(live) - set(state_dict)), sorted(set(state_dict) - set(live))
            raise UserError(f"adapter {self.adapter!r}: checkpoint keys differ (missing {missing[:5]}, extra {extra[:5]})")
        with torch.no_grad():
            for key, param in live.items():
                param.copy_(state_dict[key])


def policy_state(model) -> Stateful:
    """What an NFT checkpoint's `policy` component is: the policy adapter with LoRA, every weight of
    the transformer for a full fine-tune (which has no old adapter; preflight)."""
    if model.lora:
        return AdapterState(model.transformer, "policy")
    from cosmos_rl.checkpoint import ModelState

    return ModelState(model.state_module(), trainable_only=False)


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
