"""What a suite is: one world that `eval`, `[rl.eval]`, `pairs mine`, the reward registry and the
first-frame source ask for by name (`suites.registry`). Torch-free, and free of any world: a suite's
code is named by "module:attr" import strings resolved on first use (as `config/algorithms.py`
names an algorithm's code), so `validate` reads every suite's names, media and rewards without
importing a world.

A suite has
- a name (the registry's key: a built-in name, or the `package.module:SUITE` import string that
  names it from a manifest) and a title for prose ("shapes", "moving-shapes");
- its media: what its verifier judges, images (1 frame) or clips, at the size its base makes;
- its base preset (`preset:NAME`, `model.preset`), "" when it ships none;
- held-out prompts with their tasks (`held_out(per_task)`: at most `per_task` per task, evenly
  spread by `spread`, in task order; 0 = all);
- a verifier (`verify(samples, captions)`: strict and partial per sample; `task_of(caption)` the
  task a caption counts under, a ValueError for a caption outside the world's grammar;
  `scores_by_task` groups either score by task);
- the rewards it registers (`SuiteReward`: each is its verifier's strict or partial score, some
  also judging frame 0 against the given first frame);
- its conditioning source (`given_frames(captions, media, seeds)`: the given first frame of each
  caption's ground truth), or none.

That is a **prompt suite** (shapes, shapes_video): its unit is a caption. An **episode suite** (a
world model's world, `pusht`) is judged on windows of episodes instead of captions, and has, in
place of the prompt fields (held-out prompts, `caption_task`, `verifier`, rewards: all left empty):
- held-out windows (`held_out_windows(per_task, media)` -> [`data.episodes.EpisodeWindow`]: at most
  `per_task` per task (0 = all), in task order, frames at `media`'s size, `media.frames` frames
  each; the split is the suite's own, disjoint from anything it trains on);
- a verifier per mode (`judge_window(mode, window, frames, actions, given)` -> `WindowVerdict`):
  `mode` is an action mode (`core.actions.ACTION_MODES`) or "continuation" (leading frames given,
  no actions), `frames` uint8 [F, H, W, 3] the sample's clip, `actions` [chunk, width] its action
  rows in the embodiment's units (given or generated), `given` the leading frames that were given;
- its actions (`action_spec(mode, chunk)` -> `core.actions.ActionSpec`: embodiment and normalisation);
- optionally, training windows named by a key (`window_of(key, media, check_only=False)` ->
  `EpisodeWindow`: the window a prompt row's key names, rebuilt deterministically; a ValueError for
  a key outside its grammar, in the held-out split or too short for `media`; `check_only` checks
  the key without building the window and returns None). An online run's prompt rows are such keys
  (`[model.condition] source = NAME`), and the suite's rewards (allowed then) are scorers of clips
  against the keys' windows: the key travels with each rollout as its prompt string.
Either kind may class pixels as its verifier sees them (`pixel_classes(frames)` -> int8 [N, H, W],
0 the background and i > 0 the i-th of `pixel_class_names`, on uint8 frames [N, H, W, 3]), which a
VAE stage's loss weights by (`[rl.pixel_weights]`: the pixels that decide a verdict, and those the
decoded frame classes wrongly).
`cosmos-rl eval --suite NAME` scores an episode suite's windows x seeds (`evaluation.world`);
`is_episodic` tells the two kinds apart, and a prompt-suite question asked of an episode suite
(`held_out`, `task_of`, `verify`, `default_reward`) is a ValueError naming it.

A suite outside the package is a `Suite` value in the user's module, named in a manifest as
`package.module:SUITE` (`rl.eval.suite`, `cosmos-rl eval --suite`); its rewards are then named
`package.module:SUITE/REWARD` (`rl.reward.name`, `rl.eval.reward`, `--reward`).
docs/architecture.md ("Adding a suite") lists the files one needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import attrs

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.core.imports import load_attr

# Code a suite runs: a "module:attr" import string, or (outside the package) the object itself.
Code = Any
T = TypeVar("T")


def spread(values: Sequence[T], k: int) -> list[T]:
    """`k` evenly spread elements of `values` (all of them when k is 0 or >= len).

    The i-th pick is values[(2i + 1) * n // (2k)], the middle of the i-th of k equal slices:
    spread(range(10), 3) -> [1, 5, 8]; spread("abc", 1) -> ["b"].
    """
    n = len(values)
    if k <= 0 or k >= n:
        return list(values)
    return [values[(2 * i + 1) * n // (2 * k)] for i in range(k)]


@attrs.frozen(kw_only=True)
class SuiteReward:
    """One reward a suite registers: `scorer(samples, prompts, mode=part) -> list[float]`, one float
    per sample (uint8 [N, H, W, 3] images, or [N, F, H, W, 3] clips when the suite judges clips)."""

    name: str  # as a manifest names it (a suite outside the package: "package.module:SUITE/NAME")
    scorer: Code  # "module:function", imported on the first call, or the function itself
    part: Literal["strict", "partial"] = "strict"  # which of the verifier's scores it is (pairs mine ranks by it)
    given_frame: bool = False  # also judges frame 0 against the suite's given first frame (image-to-video)
    # Scores each sample's generated action rows (world units, `scorer(..., actions=[N, n, width])`):
    # a policy-mode reward, served with the rows (`rewards.app`, the request's `actions`).
    actions: bool = False


@attrs.frozen(kw_only=True)
class Suite:
    """One world (module docstring). Code fields are "module:attr" strings or the objects themselves."""

    name: str
    title: str  # in prose: "the {title} verifier", "{title} held-out prompts"
    media: MediaSpec  # what the verifier judges (frames > 1: clips) at the size its base makes
    rewards: tuple[SuiteReward, ...]  # the first is evaluation's default: the verifier's strict score; an episode suite: () or, with window_of, scorers of keyed windows
    tasks_of: Code  # the tuple of its task names, in report order
    held_out_title: str  # the held-out prompts (or windows) for people: "shapes held-out prompts (split seed 0)"
    held_out_prompts: Code = ""  # (per_task) -> [(caption, task), ...] in task order; "" for an episode suite
    caption_task: Code = ""  # (caption) -> task; ValueError outside the world's grammar; "" for an episode suite
    verifier: Code = ""  # (samples, captions) -> (strict per sample, partial per sample); "" for an episode suite
    prompt_source: str = ""  # where prompts of its grammar come from, for messages: "python -m ... prompts DIR"
    preset: str = ""  # its base preset (`preset:NAME`); "" = none
    first_frames: Code = ""  # (captions, media, seeds or None) -> uint8 [N, H, W, 3]; "" = no given frames
    canonical_caption: Code = ""  # (caption) -> one spelling of rewordings; "" = lowercased, spaces joined
    frame_suite: str = ""  # clips: the image suite whose rewards score this suite's clips frame by frame
    frame_captions: Code = ""  # clips: (captions) -> each one's per-frame caption for frame_suite, None for none
    # An episode suite's (module docstring); "" for a prompt suite.
    held_out_windows: Code = ""  # (per_task, media) -> [EpisodeWindow, ...] in task order
    judge_window: Code = ""  # (mode, window, frames, actions, given) -> WindowVerdict
    action_spec: Code = ""  # (mode, chunk) -> ActionSpec
    window_of: Code = ""  # (key, media) -> EpisodeWindow of a training window's key; "" = no keyed windows (no rewards)
    # Either kind (module docstring): the verifier's pixel classes, for a VAE stage's loss weights.
    pixel_classes: Code = ""  # (uint8 frames [N, H, W, 3]) -> int8 [N, H, W]: 0 background, i the i-th name below
    pixel_class_names: tuple[str, ...] = ()  # the classes 1, 2, ... name in order; () when pixel_classes is ""

    def __attrs_post_init__(self):
        if bool(self.pixel_classes) != bool(self.pixel_class_names):
            raise ValueError(f"suite {self.name!r}: pixel_classes and pixel_class_names come together")
        episode = (self.held_out_windows, self.judge_window, self.action_spec)
        prompt = (self.held_out_prompts, self.caption_task, self.verifier)
        if any(episode):
            if not all(episode) or any(prompt) or (self.rewards and not self.window_of):
                raise ValueError(f"suite {self.name!r}: an episode suite has held_out_windows, judge_window and action_spec, "
                                 "no held-out prompts, caption_task or verifier, and rewards only with window_of")  # fmt: skip
            names = [r.name for r in self.rewards]
            if len(set(names)) != len(names):
                raise ValueError(f"suite {self.name!r}: reward names repeat: {names}")
            return
        if self.window_of:
            raise ValueError(f"suite {self.name!r}: window_of names training windows, which only an episode suite has")
        if not all(prompt):
            raise ValueError(f"suite {self.name!r}: a prompt suite needs held_out_prompts, caption_task and verifier")
        if not self.rewards:
            raise ValueError(f"suite {self.name!r}: registers no reward; its first reward is evaluation's default")
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"suite {self.name!r}: reward names repeat: {names}")

    # -------------------------------------------------------------------------------- code
    def resolve(self, what: str) -> Any:
        """The object one of the code fields names (None when the field is empty)."""
        value = getattr(self, what)
        if isinstance(value, str):
            return load_attr(value) if value else None
        return value

    @property
    def is_episodic(self) -> bool:
        """An episode suite (module docstring): judged on episode windows, not captions."""
        return bool(self.held_out_windows)

    def _prompts_only(self, what: str) -> None:
        if self.is_episodic:
            raise ValueError(f"suite {self.name!r} is an episode suite: it has no {what}; "
                             f"`cosmos-rl eval --suite {self.name}` scores its held-out episode windows")  # fmt: skip

    @property
    def judges_clips(self) -> bool:
        return self.media.is_video

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.resolve("tasks_of"))

    @property
    def default_reward(self) -> str:
        self._prompts_only("rewards")
        return self.rewards[0].name

    def reward_names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def reward(self, name: str) -> SuiteReward | None:
        return next((r for r in self.rewards if r.name == name), None)

    # --------------------------------------------------------------------------- the world
    def held_out(self, per_task: int) -> list[tuple[str, str]]:
        """(caption, task) of its held-out prompts, at most `per_task` per task (0 = all), in task order."""
        self._prompts_only("held-out prompts")
        return [(caption, task) for caption, task in self.resolve("held_out_prompts")(per_task)]

    def task_of(self, caption: str) -> str:
        """The task `caption` counts under; ValueError for a caption outside the world's grammar."""
        self._prompts_only("caption grammar")
        return self.resolve("caption_task")(caption)

    def verify(self, samples, captions: Sequence[str]) -> tuple[list[float], list[float]]:
        """(strict, partial) per uint8 sample: images [N, H, W, 3], or clips [N, F, H, W, 3]."""
        self._prompts_only("caption verifier (its verifier judges windows: `judge`)")
        strict, partial = self.resolve("verifier")(samples, list(captions))
        return [float(s) for s in strict], [float(p) for p in partial]

    def canonical(self, caption: str) -> str:
        """One spelling for every rewording of `caption` (overlap checks of training and held-out prompts)."""
        fn = self.resolve("canonical_caption")
        return fn(caption) if fn is not None else " ".join(caption.lower().split())

    @property
    def gives_frames(self) -> bool:
        return bool(self.first_frames)

    def given_frames(self, captions: Sequence[str], media: MediaSpec, seeds: Sequence[int] | None = None):
        """uint8 [N, H, W, 3]: the given first frame of each caption's ground truth at `media`'s size
        (at its seed, or at the suite's own seed when `seeds` is None: the frame its I2V rewards judge
        frame 0 against). ValueError for a suite that gives none."""
        fn = self.resolve("first_frames")
        if fn is None:
            raise ValueError(f"suite {self.name!r} gives no first frames (it has no conditioning source)")
        if seeds is not None and len(seeds) != len(captions):
            raise ValueError(f"got {len(seeds)} seeds for {len(captions)} captions")
        return fn(list(captions), media, None if seeds is None else list(seeds))


    # ------------------------------------------------------------------- an episode suite
    def windows(self, per_task: int, media: MediaSpec) -> list:
        """Its held-out `EpisodeWindow`s: at most `per_task` per task (0 = all), at `media`'s size and frames."""
        if not self.is_episodic:
            raise ValueError(f"suite {self.name!r} is a prompt suite: it has held-out prompts, not episode windows")
        return list(self.resolve("held_out_windows")(per_task, media))

    def judge(self, mode: str, window, frames, actions, given: int) -> "WindowVerdict":
        """One sample of `window` in `mode` (module docstring) judged by the suite's verifier."""
        if not self.is_episodic:
            raise ValueError(f"suite {self.name!r} is a prompt suite: it judges captions (`verify`), not episode windows")
        return self.resolve("judge_window")(mode, window, frames, actions, given)

    @property
    def keys_windows(self) -> bool:
        """An episode suite whose training windows are named by keys (`window_of`): an online run's source."""
        return self.is_episodic and bool(self.window_of)

    def window(self, key: str, media: MediaSpec, check_only: bool = False):
        """The training `EpisodeWindow` that `key` names, `media.frames` frames at `media`'s size;
        ValueError for a key outside the suite's grammar (or one it has no keyed windows for).
        `check_only`: the key checked, nothing built (None)."""
        if not self.keys_windows:
            raise ValueError(f"suite {self.name!r} names no training windows by key")
        return self.resolve("window_of")(key, media, check_only=check_only)

    def actions_of(self, mode: str, chunk: int):
        """The `ActionSpec` of an action mode over `chunk` rows (embodiment and normalisation)."""
        if not self.is_episodic:
            raise ValueError(f"suite {self.name!r} is a prompt suite: it has no actions")
        return self.resolve("action_spec")(mode, chunk)


@attrs.frozen(kw_only=True)
class WindowVerdict:
    """An episode suite's verdict on one sample of a window: `strict` (1.0 or 0.0), `partial` (in
    [0, 1]), and the mode's further numbers by name (`metrics`: an action error, a coverage change),
    each averaged and bootstrapped as the scores are."""

    strict: float
    partial: float
    metrics: dict = attrs.field(factory=dict)


def scores_by_task(suite: Suite, captions: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
    """{task: mean score} over the tasks present, in the suite's task order.

    ["a circle", "a square", "two circles"] scored [1, 0, 1] by the shapes suite ->
    {"single_object": 0.5, "counting": 1.0}.
    """
    if len(captions) != len(scores):
        raise ValueError(f"got {len(captions)} captions but {len(scores)} scores")
    by_task: dict[str, list[float]] = {}
    for caption, score in zip(captions, scores):
        by_task.setdefault(suite.task_of(caption), []).append(float(score))
    return {task: sum(by_task[task]) / len(by_task[task]) for task in suite.tasks if task in by_task}

