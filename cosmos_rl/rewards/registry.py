"""The rewards one service offers: the weight-free functions, the rewards of the built-in suites
(and of the outside suites it is told of), plus model rewards from local folders.

A suite's rewards register through the suite (`cosmos_rl.suites.registry`): each is the suite's
`scorer(samples, prompts, mode=part)`, named by an import string and imported on its first call, so
the service starts (and serves every other reward) without importing a world; it scores images, or
whole clips when the suite judges clips. Each reward declares what it scores (`modalities`) and
whether it reads its prompt. The service (uvicorn or Ray Serve) holds one registry and batches
requests per reward.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.functions import REWARDS, RewardFn, check_images
from cosmos_rl.rewards.video import check_clips
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import Suite, SuiteReward

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
    # Named dimensions fn scores besides its score (fn then returns a `dimensions.Scored`); /info lists them.
    dimensions: tuple[str, ...] = ()
    # fn also takes each sample's action rows, `fn(samples, prompts, actions=[N, n, width])` (a policy-mode
    # reward); a request must carry them (`rewards.app`, protocol 2). /info lists such rewards.
    takes_actions: bool = False

    def __attrs_post_init__(self):
        if not self.modalities or set(self.modalities) - set(MODALITIES):
            raise ValueError(f"reward {self.name!r}: modalities must be a non-empty subset of {MODALITIES}, got {self.modalities}")


class ImportedScorer:
    """A suite's reward: its scorer (`module:function`, imported on the first call, or the function
    itself) called as scorer(samples, prompts, mode=mode) after `check` has judged the input."""

    def __init__(self, target: str | Callable, mode: str, check: Callable = check_clips):
        if isinstance(target, str):
            module, sep, function = target.partition(":")
            if not (module and sep and function):
                raise ValueError(f"scorer {target!r} must be 'module:function'")
        self.target, self.mode, self.check = target, mode, check
        self._function = None if isinstance(target, str) else target
        self._lock = threading.Lock()

    def resolve(self) -> Callable:
        with self._lock:
            if self._function is None:
                module, _, name = self.target.partition(":")
                try:
                    self._function = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError) as exc:
                    # A service built without the scorer: a fault of the service, never of the request.
                    raise RuntimeError(f"the scorer {self.target} cannot be loaded ({exc})") from None
            return self._function

    def __call__(self, samples: np.ndarray, prompts: Sequence[str], actions: np.ndarray | None = None) -> list[float]:
        self.check(samples, prompts)
        rows = {} if actions is None else {"actions": actions}  # only an action reward is handed rows (Reward.takes_actions)
        return [float(s) for s in self.resolve()(samples, list(prompts), mode=self.mode, **rows)]


def suite_reward(suite: Suite, reward: SuiteReward) -> Reward:
    """One reward of `suite` as the service registers it (whole clips when the suite judges clips)."""
    clips = suite.judges_clips
    fn = ImportedScorer(reward.scorer, reward.part, check_clips if clips else check_images)
    return Reward(reward.name, fn, f"{reward.name}:{BUILTIN_VERSION}", max_batch=32 if clips else 256,
                  modalities=("video",) if clips else ("image",), takes_actions=reward.actions)  # fmt: skip


def builtin_rewards(outside_suites: Sequence[str] = ()) -> dict[str, Reward]:
    """The weight-free rewards and every reward of the built-in suites, and of the `outside_suites`
    (import strings, `package.module:SUITE`: an UnknownSuite when one cannot be imported)."""
    registry = {
        name: Reward(name, fn, f"{name}:{BUILTIN_VERSION}", max_batch=256, uses_prompt=name not in PROMPT_FREE)
        for name, fn in REWARDS.items()
    }
    for suite in [*suites.builtin_suites(), *(suites.get(name) for name in outside_suites)]:
        for reward in suite.rewards:
            registry[reward.name] = suite_reward(suite, reward)
    return registry


def reward_fns() -> dict[str, RewardFn]:
    """{name: fn} of every built-in reward, called in-process (evaluation, the local trainer of tests)."""
    return {name: reward.fn for name, reward in builtin_rewards().items()}


def parse_model_specs(specs: list[str]) -> dict[str, str]:
    """`--model NAME=FOLDER` items -> {NAME: FOLDER}; each NAME once."""
    from cosmos_rl.rewards.models import SERVED_KINDS

    out: dict[str, str] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise UserError(f"--model {spec!r}: expected NAME=FOLDER, e.g. --model pickscore=/models/PickScore_v1")
        if name not in SERVED_KINDS:
            raise UserError(f"--model {spec!r}: unknown model reward {name!r}; use one of {list(SERVED_KINDS)}")
        if name in out:
            raise UserError(f"--model {name}=... given twice; give each model reward once")
        out[name] = folder
    return out


def build_registry(
    models: Mapping[str, str | Path] | None = None, device: str = "auto", outside_suites: Sequence[str] = (),
    option: str = "--model",
) -> dict[str, Reward]:
    """The built-in rewards (and those of `outside_suites`) plus one model reward per {kind: folder}
    entry (loaded now); `option` is what named the folders, in messages."""
    registry = builtin_rewards(outside_suites)
    for kind, folder in (models or {}).items():
        registry[kind] = model_reward(kind, folder, device, option)
    return registry


def model_reward(kind: str, folder: str | Path, device: str = "auto", option: str = "--model") -> Reward:
    """The model reward `kind` loaded from `folder`: a CLIP reward (images), or VideoAlign (whole
    clips, with its VQ/MQ/TA dimensions)."""
    from cosmos_rl.rewards.videoalign import KIND as VIDEOALIGN

    if kind == VIDEOALIGN:
        from cosmos_rl.rewards.videoalign import VideoAlignReward

        model = VideoAlignReward(folder, device=device, option=option)
        # A 2B VLM's forward per clip: a small batch keeps one request's latency bounded.
        return Reward(kind, model, model.revision, max_batch=8, modalities=("video",), dimensions=model.dimensions)
    from cosmos_rl.rewards.models import ClipRewardModel

    model = ClipRewardModel(kind, folder, device=device, option=option)
    return Reward(kind, model, model.revision, max_batch=32, uses_prompt=kind not in PROMPT_FREE)
