"""The rewards one service offers: the weight-free functions plus model rewards from local folders.

The shapes world's verifier and any later reward register here too; the service (uvicorn or Ray
Serve) holds one registry and batches requests per reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from cosmos_rl.errors import UserError
from cosmos_rl.rewards.functions import REWARDS, RewardFn

# Bumped when a weight-free function's definition changes, so its revision changes with it.
BUILTIN_VERSION = "builtin-1"


@attrs.frozen
class Reward:
    name: str
    fn: RewardFn  # uint8 [N, H, W, 3], N prompts -> N floats
    revision: str  # this reward's own revision; model rewards include a hash of the weights
    max_batch: int = 64  # images per call when requests are batched together


def builtin_rewards() -> dict[str, Reward]:
    return {name: Reward(name, fn, f"{name}:{BUILTIN_VERSION}", max_batch=256) for name, fn in REWARDS.items()}


def parse_model_specs(specs: list[str]) -> dict[str, str]:
    """`--model NAME=FOLDER` items -> {NAME: FOLDER}; each NAME once."""
    from cosmos_rl.rewards.models import MODEL_KINDS

    out: dict[str, str] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise UserError(f"--model {spec!r}: expected NAME=FOLDER, e.g. --model pickscore=/models/PickScore_v1")
        if name not in MODEL_KINDS:
            raise UserError(f"--model {spec!r}: unknown model reward {name!r}; use one of {list(MODEL_KINDS)}")
        if name in out:
            raise UserError(f"--model {name}=... given twice; give each model reward once")
        out[name] = folder
    return out


def build_registry(models: Mapping[str, str | Path] | None = None, device: str = "auto") -> dict[str, Reward]:
    """The weight-free rewards plus one model reward per {kind: folder} entry (loaded now)."""
    registry = builtin_rewards()
    for kind, folder in (models or {}).items():
        from cosmos_rl.rewards.models import ClipRewardModel

        model = ClipRewardModel(kind, folder, device=device)
        registry[kind] = Reward(kind, model, model.revision, max_batch=32)
    return registry
