"""The algorithm registry: every place that differs per algorithm asks its entry here.

One `Algorithm` entry per `rl.algorithm` value holds its config class and, as "module:attr" import
strings resolved only when used (so this module stays torch-free and imports nothing above
`config/`; an entry defined outside the package may hold the objects themselves), the code each layer runs for it: preflight rules, the plan section, the data check,
the rank trainer. Plain values say the rest: the launcher kind, the seed-contract keys, which
fields are paths, the training signal the reward-hacking watch reads, the sampler fields.

An unknown name is an error, never a fallback to another algorithm. A manifest may name an
algorithm outside the package as an import string, `rl.algorithm = "package.module:ENTRY"`, where
ENTRY is an `Algorithm`; or code may call `register()` first. docs/architecture.md ("Adding an
algorithm") lists the files a new entry needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Literal

import attrs

from cosmos_rl.core import schema
from cosmos_rl.core.imports import load_attr

# "ranks": every rank runs the step loop (torchrun workers, or Ray actors); any world size.
# "driver": a Ray driver runs the loop and calls every actor (rollouts need the reward services it starts).
Launcher = Literal["ranks", "driver"]
# Code an entry runs: a "module:attr" import string, or (outside the package) the object itself.
Code = Any


def data_parallel_world(config: schema.RunConfig) -> tuple[int, str]:
    """(world size, how it was derived) for algorithms whose ranks split each step's data."""
    g, dp = config.grid, config.model.config.parallelism.data_parallel_shard_degree
    return dp, f"model.config.parallelism.data_parallel_shard_degree = {dp} (= grid.nodes {g.nodes} x grid.gpus_per_node {g.gpus_per_node})"


def group_world(config: schema.RunConfig) -> tuple[int, str]:
    """(world size, derivation) for one model rank per sample of a prompt's group, or one context
    group of `grid.context_parallel` ranks per sample."""
    size, cp = config.rl.group_size, config.grid.context_parallel
    if cp > 1:
        return size * cp, f"rl.group_size {size} x grid.context_parallel {cp}: one context group of {cp} ranks per sample of a group"
    return size, f"rl.group_size = {size}: one model rank per sample of a group"


@attrs.frozen(kw_only=True)
class Algorithm:
    """What one `rl.algorithm` value means to every layer (import strings are "module:attr")."""

    name: str  # the `rl.algorithm` value
    config: type  # its `rl` table: a subclass of schema.RLBase
    title: str  # its name in prose (docs/manifest.md headings)
    launcher: Launcher
    trainer: Code  # the rank trainer class (trainers/rank.py protocol)
    preflight: Code = ""  # (config, rl, rules) -> None: its rules beyond the common ones
    plan_section: Code = ""  # (config, base_dir) -> dict merged into `plan`
    checkpoint_contents: Code = ""  # (config) -> list of what a checkpoint holds, for `plan`
    data_check: Code = ""  # (config, base_dir, full) -> (problems, notes) for `validate --data`
    train_prompts: Code = ""  # (rl) -> the prompt list the run trains on, when it has one
    world_size: Callable[[schema.RunConfig], tuple[int, str]] = data_parallel_world
    seed_keys: tuple[str, ...] = ()  # rl fields (dotted, below rl.) that fix its random draws
    path_fields: tuple[str, ...] = ()  # rl fields holding local paths ("data.shards[]": each list item)
    train_signal: str = ""  # the metric the reward-hacking watch compares with eval/score; "" = none
    sampler_fields: tuple[str, str, str] | None = None  # its own (steps, shift, guidance) fields, if it samples
    part_field: str = ""  # an rl field naming what trains ("transformer" or "vae"); "" = the transformer
    reshards_world: bool = True  # a non-exact resume may change the world size (DCP reshards)
    unit: str = "samples"  # what the progress bar counts
    # Its training loop runs context parallel (grid.context_parallel > 1, docs/long_clips.md): each
    # sample fed to a group of ranks, seeds and shares by data-parallel rank. Otherwise preflight refuses N > 1.
    context_parallel: bool = False
    video: bool = False  # trains clips (model.num_frames > 1); otherwise preflight refuses them
    # Where a conditioned sample's given frames come from for it ([model.condition]): "" takes no
    # condition, "data" its training samples' own frames (SFT), "rollout" an image or a suite per rollout,
    # "pairs" each preference pair's window key (DPO in forward dynamics: frame 0 and the action rows).
    conditioned_from: str = ""
    # What one step costs in images (`cosmos-rl compare`): "group" = group_size x prompts_per_step
    # generated, "pairs" = 2 x pairs_per_step seen, "samples" = samples_per_step seen, "" = none.
    image_count: str = ""

    def resolve(self, what: str) -> Any:
        """The object one of the code fields names (None when the field is empty)."""
        value = getattr(self, what)
        if not value:
            return None
        return load_attr(value) if isinstance(value, str) else value

    def resolve_name(self, what: str) -> str:
        """A code field as a dotted name for people (`plan`): "cosmos_rl.trainers.nft.NFTTrainer"."""
        value = getattr(self, what)
        if isinstance(value, str):
            return value.replace(":", ".")
        return f"{value.__module__}.{value.__qualname__}"

    def trained_part(self, rl) -> str:
        return getattr(rl, self.part_field) if self.part_field else "transformer"


_REGISTRY: dict[str, Algorithm] = {}


def register(entry: Algorithm) -> Algorithm:
    """Add an algorithm; registering a different entry under a taken name is an error."""
    if not issubclass(entry.config, schema.RLBase):
        raise TypeError(f"algorithm {entry.name!r}: its config must subclass schema.RLBase")
    known = _REGISTRY.get(entry.name)
    if known is not None and known != entry:
        raise ValueError(f"algorithm {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


class UnknownAlgorithm(LookupError):
    """`rl.algorithm` names nothing registered and no importable entry."""


def names() -> list[str]:
    """The registered names, built-ins first."""
    return list(_REGISTRY)


def get(name: str) -> Algorithm:
    """The entry for `name`; an import string ("module:ENTRY") is imported and registered under it."""
    entry = _REGISTRY.get(name)
    if entry is not None:
        return entry
    if ":" not in name:
        raise UnknownAlgorithm(f"unknown algorithm {name!r}")
    try:
        found = load_attr(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UnknownAlgorithm(f"cannot import algorithm {name!r}: {exc}") from None
    if not isinstance(found, Algorithm):
        raise UnknownAlgorithm(f"{name!r} is not a cosmos_rl.config.algorithms.Algorithm")
    if found.name != name:
        found = attrs.evolve(found, name=name)  # the manifest's spelling is its name everywhere (checkpoints, plan)
    return register(found)


def of(config: schema.RunConfig) -> Algorithm:
    """The entry of a loaded config (its name was looked up when the manifest was read)."""
    return get(config.rl.algorithm)


def check_data(config: schema.RunConfig, base_dir, *, full: bool = False) -> tuple[list, list[str]]:
    """(problems, one note per source read) for the data the run names (`validate --data`), as its
    entry's `data_check` reads it (none: nothing to read); paths relative to `base_dir`."""
    check = of(config).resolve("data_check")
    return check(config, Path(base_dir), full) if check is not None else ([], [])


def seed_values(entry: Algorithm, rl) -> dict[str, Any]:
    """{"rl.KEY": value} for the entry's seed-contract keys."""
    return {f"rl.{key}": _get_path(rl, key) for key in entry.seed_keys}


def _get_path(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def with_paths(entry: Algorithm, rl, pin: Callable[[str], str]):
    """`rl` with `pin` applied to each of the entry's path fields."""
    for field in entry.path_fields:
        rl = _evolve_path(rl, field.split("."), pin)
    return rl


def _evolve_path(obj, parts: list[str], pin: Callable[[str], str]):
    head, rest = parts[0], parts[1:]
    each = head.endswith("[]")
    name = head[:-2] if each else head
    value = getattr(obj, name)
    if each:
        new = [pin(v) for v in value] if not rest else [_evolve_path(v, rest, pin) for v in value]
    else:
        new = pin(value) if not rest else _evolve_path(value, rest, pin)
    return attrs.evolve(obj, **{name: new})


# The online seed contract: what fixes a rollout's noise and the prompt rows it samples.
ONLINE_SEED_KEYS = ("rollout_seed_clock", "group_size", "prompts_per_step", "prompts.shuffle", "async_reward")


def online(**fields) -> Algorithm:
    """An entry for an online algorithm (config subclassing schema.OnlineRLBase, trainer subclassing
    trainers.online.OnlineTrainer): launched from the Ray driver with reward services, one rank per
    sample of a group, the online seed contract, prompts, checkpoints and sampler of NFT's
    machinery. `fields` gives the rest (name, config, title, trainer, ...) and may override these."""
    shared = dict(
        launcher="driver",
        preflight="cosmos_rl.config.preflight.online:online_rules",
        plan_section="cosmos_rl.planning.online_plan:online_section",
        checkpoint_contents="cosmos_rl.planning.plan:online_contents",
        data_check="cosmos_rl.rewards.prompt_rows:prompt_data",
        train_prompts="cosmos_rl.data.prompts:run_prompts",
        world_size=group_world,
        seed_keys=ONLINE_SEED_KEYS,
        path_fields=("prompts.file", "rewards[].model"),
        train_signal="train/reward_mean",
        sampler_fields=("sample_steps", "sampler_shift", "guidance"),
        reshards_world=False,
        image_count="group",
    )
    return Algorithm(**{**shared, **fields})


# ------------------------------------------------------------------------------- the built-ins
register(Algorithm(
    name="dpo", config=schema.DPOConfig, title="Diffusion-DPO", launcher="ranks",
    trainer="cosmos_rl.trainers.dpo:DPOTrainer",
    preflight="cosmos_rl.config.preflight.dpo:dpo_rules",
    plan_section="cosmos_rl.planning.offline_plan:dpo_section",
    checkpoint_contents="cosmos_rl.planning.plan:dpo_contents",
    data_check="cosmos_rl.data.scan:pair_data",
    seed_keys=("data.shuffle", "data.synthetic_seed"),
    path_fields=("data.jsonl", "data.shards[]", "validation.data.jsonl", "validation.data.shards[]"),
    train_signal="train/dpo_reward_margin", unit="pairs", image_count="pairs",
    video=True,  # clip pairs with model.num_frames > 1 (docs/video.md "DPO on clips")
    context_parallel=True,  # a context group per data-parallel share (trainers/spmd.py)
    conditioned_from="pairs",  # forward dynamics on mined pairs of window keys (docs/world_training.md "DPO in forward dynamics")
))  # fmt: skip
register(online(
    name="nft", config=schema.NFTConfig, title="DiffusionNFT",
    trainer="cosmos_rl.trainers.nft:NFTTrainer",
    preflight="cosmos_rl.config.preflight.nft:nft_rules",
    plan_section="cosmos_rl.planning.online_plan:nft_section",
    video=True,  # rl.modality = "video" with model.num_frames > 1 (docs/video.md "NFT on video")
    conditioned_from="rollout",  # I2V NFT (docs/video.md "Conditioning: image to video")
    context_parallel=True,  # one context group per sample of a group (trainers/online_collectives.py)
))  # fmt: skip
register(Algorithm(
    name="sft", config=schema.SFTConfig, title="supervised fine-tuning", launcher="ranks",
    trainer="cosmos_rl.trainers.sft:SFTTrainer",
    preflight="cosmos_rl.config.preflight.sft:sft_rules",
    plan_section="cosmos_rl.planning.offline_plan:sft_section",
    checkpoint_contents="cosmos_rl.planning.plan:sft_contents",
    data_check="cosmos_rl.data.lerobot_check:sft_data",
    seed_keys=("data.shuffle",),
    path_fields=("data.jsonl", "data.shards[]", "data.lerobot"),
    part_field="train", video=True, image_count="samples",
    conditioned_from="data",  # T2V and I2V at once (model.condition.probability)
    context_parallel=True,  # a context group per data-parallel share, as DPO (trainers/spmd.py)
))  # fmt: skip
register(online(
    name="grpo", config=schema.GRPOConfig, title="Flow-GRPO",
    trainer="cosmos_rl.trainers.grpo:GRPOTrainer",
    preflight="cosmos_rl.config.preflight.grpo:grpo_rules",
    plan_section="cosmos_rl.planning.online_plan:grpo_section",
    checkpoint_contents="cosmos_rl.planning.online_plan:grpo_contents",
    video=True,  # clips with model.num_frames > 1 (docs/grpo.md "GRPO on clips")
    conditioned_from="rollout",  # I2V and forward dynamics, as NFT (docs/grpo.md "GRPO on clips")
    context_parallel=True,  # one context group per sample of a group, as NFT (trainers/online_collectives.py)
    # the fast variant's window draws: which steps take SDE noise
    seed_keys=(*ONLINE_SEED_KEYS, "sde_window", "sde_window_range", "same_initial_noise"),
))  # fmt: skip

# The names this package ships (docs/manifest.md documents these tables; others are the user's own).
BUILT_IN = tuple(_REGISTRY)
