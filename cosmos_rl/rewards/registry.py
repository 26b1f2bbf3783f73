"""The rewards one service offers: the weight-free functions plus model rewards from local folders.

The shapes world's verifiers (of images and of clips) and any later reward register here too; each
declares what it scores (`modalities`) and whether it reads its prompt. The service (uvicorn or
Ray Serve) holds one registry and batches requests per reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.functions import REWARDS, RewardFn
from cosmos_rl.rewards.video import video_rewards

# Bumped when a weight-free function's definition changes, so its revision changes with it.
BUILTIN_VERSION = "builtin-1"
# What a reward scores: `image` = images (uint8 [N, H, W, 3]), `video` = whole clips ([N, F, H, W, 3]).
MODALITIES = ("image", "video")
# Rewards that never read their prompt, so a clip with no per-frame caption can still be scored
# frame by frame by them (every other reward is scored against a prompt).
PROMPT_FREE = frozenset({"jpeg_compressibility", "jpeg_incompressibility", "brightness", "aesthetic"})


@attrs.frozen
class Reward:
    name: str
    fn: RewardFn  # images [N, H, W, 3] (or, for a `video` reward, clips [N, F, H, W, 3]), N prompts -> N floats
    revision: str  # this reward's own revision; model rewards include a hash of the weights
    max_batch: int = 64  # images (or clips) per call when requests are batched together
    modalities: tuple[str, ...] = ("image",)  # what the reward's fn takes; /info lists it
    uses_prompt: bool = True  # False: the prompt plays no part in the score; /info lists it

    def __attrs_post_init__(self):
        if not self.modalities or set(self.modalities) - set(MODALITIES):
            raise ValueError(f"reward {self.name!r}: modalities must be a non-empty subset of {MODALITIES}, got {self.modalities}")


def builtin_rewards() -> dict[str, Reward]:
    registry = {
        name: Reward(name, fn, f"{name}:{BUILTIN_VERSION}", max_batch=256, uses_prompt=name not in PROMPT_FREE)
        for name, fn in REWARDS.items()
    }
    for name, fn in video_rewards().items():
        registry[name] = Reward(name, fn, f"{name}:{BUILTIN_VERSION}", max_batch=32, modalities=("video",))
    return registry


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
        registry[kind] = Reward(kind, model, model.revision, max_batch=32, uses_prompt=kind not in PROMPT_FREE)
    return registry
