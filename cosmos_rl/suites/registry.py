"""The suite registry: every place that asks for a world asks it here, by name. Torch-free.

The built-in suites are named by "module:ATTR" import strings, imported on first use (importing a
suite's module imports no world: its code is import strings too, `suites.base`). A manifest (or
`cosmos-rl eval --suite`) may name a suite outside the package as an import string,
`package.module:SUITE`, where SUITE is a `suites.base.Suite`, as `rl.algorithm` names an outside
algorithm (`config/algorithms.py`): it is imported, and registered under that spelling, with its
rewards renamed `package.module:SUITE/REWARD`. An unknown name is an error naming the known suites,
never a fallback to another suite.

A reward name resolves to the suite that registers it (`reward_owner`): a built-in suite's reward by
its own name (`shapes_strict`), an outside suite's by `package.module:SUITE/REWARD`; any other name
(a weight-free or model reward) has no suite.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from cosmos_rl.core.imports import load_attr
from cosmos_rl.suites.base import Suite

# The suites this package ships, by name (docs/eval.md documents them; others are the user's own).
BUILT_IN: dict[str, str] = {
    "shapes": "cosmos_rl.suites.shapes:SHAPES",
    "shapes_video": "cosmos_rl.suites.shapes:SHAPES_VIDEO",
    "pusht": "cosmos_rl.suites.pusht:PUSHT",  # an episode suite (suites.base): `cosmos-rl eval` only
    "lerobot": "cosmos_rl.suites.lerobot:LEROBOT",  # an episode suite of a dataset's keyed windows: online runs' source and rewards only
}
OUTSIDE = "package.module:SUITE"  # how a suite outside the package is named, for messages

_LOADED: dict[str, Suite] = {}


class UnknownSuite(LookupError):
    """A suite name (or a suite's reward) that names nothing registered and no importable suite."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


def known() -> str:
    """The known suites, for messages: "shapes, shapes_video (or package.module:SUITE ...)"."""
    return ", ".join(names()) + f" (or {OUTSIDE}, a suite outside the package)"


def names() -> list[str]:
    """The built-in names first, then every outside suite imported so far."""
    return [*BUILT_IN, *(name for name in _LOADED if name not in BUILT_IN)]


def register(suite: Suite) -> Suite:
    """Add a suite under its name; a different suite under a taken name is an error."""
    if not isinstance(suite, Suite):
        raise TypeError(f"{suite!r} is not a cosmos_rl.suites.base.Suite")
    held = _LOADED.get(suite.name)
    if held is not None and held != suite:
        raise ValueError(f"suite {suite.name!r} is already registered")
    _LOADED[suite.name] = suite
    return suite


def get(name: str) -> Suite:
    """The suite `name` names: a built-in name, or an import string ("package.module:SUITE")."""
    held = _LOADED.get(name)
    if held is not None:
        return held
    if name in BUILT_IN:
        suite = load_attr(BUILT_IN[name])
        assert isinstance(suite, Suite) and suite.name == name, f"built-in suite {name!r}: {BUILT_IN[name]} names {suite!r}"
        return register(suite)
    if ":" not in name:
        raise UnknownSuite(f"unknown suite {name!r}", f"use one of {known()}")
    try:
        found = load_attr(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UnknownSuite(f"cannot import suite {name!r} ({exc})", f"put its module on PYTHONPATH, or use one of {known()}") from None
    if not isinstance(found, Suite):
        raise UnknownSuite(f"{name!r} is not a cosmos_rl.suites.base.Suite (got {type(found).__name__})",
                           f"point it at a Suite value, or use one of {known()}")  # fmt: skip
    # The manifest's spelling is its name everywhere (eval.json, the reward names it registers).
    rewards = tuple(attrs.evolve(r, name=f"{name}/{r.name}") for r in found.rewards)
    return register(attrs.evolve(found, name=name, rewards=rewards))


def builtin_suites() -> list[Suite]:
    return [get(name) for name in BUILT_IN]


def reward_owner(reward: str) -> Suite | None:
    """The suite that registers `reward` (module docstring), None for a reward no suite registers.
    An outside suite's reward that its suite does not register is an UnknownSuite."""
    prefix, slash, _ = reward.rpartition("/")
    if slash and ":" in prefix:
        suite = get(prefix)
        if suite.reward(reward) is None:
            raise UnknownSuite(f"suite {prefix!r} registers no reward {reward!r}", f"use one of {', '.join(suite.reward_names())}")
        return suite
    return next((suite for suite in builtin_suites() if suite.reward(reward) is not None), None)


def builtin_reward_names(clips: bool | None = None) -> list[str]:
    """The rewards the built-in suites register (of those judging clips, or images, when `clips` is given)."""
    return [name for suite in builtin_suites() if clips is None or suite.judges_clips == clips for name in suite.reward_names()]


def of_preset(preset: str) -> Suite | None:
    """The built-in suite whose base is `preset:NAME` (`shapes` -> the shapes suite), None for none."""
    return next((suite for suite in builtin_suites() if suite.preset and suite.preset == preset), None)


def for_media(clips: bool) -> Suite:
    """The first built-in prompt suite judging clips (or images): the suite of a run that names none and
    whose rewards no suite registers (a DPO or SFT run, or one rewarded by a weight-free reward), as
    evaluation chose before suites had names (`shapes`, `shapes_video`)."""
    return next(suite for suite in builtin_suites() if suite.judges_clips == clips and not suite.is_episodic)


def frame_by_frame(image_suite: Suite) -> Suite | None:
    """The built-in clip suite whose clips `image_suite`'s rewards score frame by frame (its `frame_suite`)."""
    return next((s for s in builtin_suites() if s.judges_clips and s.frame_suite == image_suite.name), None)


def run_suite(eval_suite: str, eval_reward: str, train_rewards: Sequence[str], clips: bool) -> Suite:
    """The suite of a run: `eval_suite` (`rl.eval.suite`) when named; else the suite that registers
    `eval_reward` (`rl.eval.reward`), else one that registers a training reward, each only when it
    judges what the run makes (`clips` or images); else the built-in suite of the run's media
    (`for_media`). So every manifest and run directory from before suites had names evaluates the
    world it did."""
    if eval_suite:
        return get(eval_suite)
    for reward in (eval_reward, *train_rewards):
        owner = reward_owner(reward)
        if owner is not None and owner.judges_clips == clips:
            return owner
    return for_media(clips)
