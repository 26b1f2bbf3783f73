"""Every cross-field rule of the specs, checked before any worker starts.

``check(config, base_dir)`` returns every problem at once (errors and warnings); it does cheap
filesystem checks only and never imports torch, ray or diffusers.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
from pathlib import Path

from cosmos_rl.config import schema
from cosmos_rl.config.problems import Problem, show

RDZV_ENV = "COSMOS_RL_RDZV_ENDPOINT"
# gloo turns a timeout into an int64-nanosecond deadline, which wraps past ~292 years (9.2e9 s) and
# then times out at once; Ray turns one into int64 milliseconds and cannot take inf. A week is far
# beyond any honest collective, so anything longer is a typo or an attempt at "never".
GRID_TIMEOUT_MAX_S = 7 * 24 * 3600
# Seeds are TOML integers, 64-bit signed (tomllib reads larger ones anyway); the synthetic generator
# needs them non-negative.
SEED_MAX = 2**63 - 1
BUILTIN_REWARDS = ("jpeg_compressibility", "jpeg_incompressibility", "brightness", "prompt_colour",
                   "shapes_strict", "shapes_partial")
MODEL_REWARDS = ("pickscore", "clipscore", "aesthetic")  # cosmos_rl.rewards.models.MODEL_KINDS, torch-free


class _Rules:
    """Collects problems; small helpers keep each rule one readable line."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.problems: list[Problem] = []

    def error(self, path: str, problem: str, got=..., fix: str = "") -> None:
        self.problems.append(Problem(path, problem, fix=fix) if got is ... else Problem(path, problem, got, fix))

    def warn(self, path: str, problem: str, got=..., fix: str = "") -> None:
        kw = {} if got is ... else {"got": got}
        self.problems.append(Problem(path, problem, fix=fix, severity="warning", **kw))

    def at_least(self, path: str, value, low, fix_hint: str = "") -> None:
        if value < low:
            self.error(path, f"must be >= {low}", value, fix_hint or f"set {path} to {low} or more")

    def positive(self, path: str, value) -> None:
        if not value > 0:
            self.error(path, "must be > 0", value, f"set {path} to a positive number")

    def local_path(self, path: str, value: str, *, kind: str) -> Path | None:
        """Resolve a manifest path relative to the manifest's folder; report it when missing."""
        if not value or "://" in value:
            return None
        resolved = Path(value) if os.path.isabs(value) else self.base_dir / value
        exists = resolved.is_dir() if kind == "folder" else resolved.exists() if kind == "any" else resolved.is_file()
        if not exists:
            self.error(path, f"{kind} not found: {resolved}", value, "fix the path (relative paths are read from the manifest's folder)")
            return None
        return resolved


def attrs_field_type(cls, name: str):
    import attrs

    return attrs.fields_dict(cls)[name].type


def resolve_path(value: str, base_dir: Path) -> str:
    """Manifest paths are relative to the manifest's folder; URLs and absolute paths pass through."""
    if not value or "://" in value or value.startswith("preset:") or os.path.isabs(value):
        return value
    return str((base_dir / value).resolve())


def check(config: schema.RunConfig, base_dir: Path | str = ".") -> list[Problem]:
    rules = _Rules(Path(base_dir))
    _common(config, rules)
    if isinstance(config.rl, schema.NFTConfig):
        _nft(config, config.rl, rules)
    elif isinstance(config.rl, schema.SFTConfig):
        _sft(config, config.rl, rules)
    else:
        _dpo(config, config.rl, rules)
    return rules.problems


# --------------------------------------------------------------------------------------- both
def _common(c: schema.RunConfig, r: _Rules) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", c.job.name):
        r.error("job.name", "must be a plain folder name (letters, digits, '.', '_', '-')", c.job.name, "rename the run")
    r.at_least("job.log_every", c.job.log_every, 1)
    if c.job.tensorboard and importlib.util.find_spec("tensorboard") is None:
        r.error("job.tensorboard", "the tensorboard package is not installed", True, "pip install tensorboard, or set job.tensorboard = false")
    if c.job.wandb_project and importlib.util.find_spec("wandb") is None:
        r.error("job.wandb_project", "the wandb package is not installed", c.job.wandb_project, 'pip install wandb, or set job.wandb_project = ""')
    if c.job.wandb_entity and not c.job.wandb_project:
        r.error("job.wandb_entity", "set without job.wandb_project, so nothing would be logged", c.job.wandb_entity, "set job.wandb_project too, or remove it")
    r.at_least("rl.max_steps", c.rl.max_steps, 1)
    r.at_least("checkpoint.every", c.checkpoint.every, 0)
    r.at_least("checkpoint.keep", c.checkpoint.keep, 0)
    r.at_least("model.lora.rank", c.model.lora.rank, 0)
    if c.model.lora.rank > 0:
        r.positive("model.lora.alpha", c.model.lora.alpha)
    if c.model.image_size < 16 or c.model.image_size % 16:
        r.error("model.image_size", "must be a multiple of 16, at least 16", c.model.image_size, "use e.g. 32 or 512")
    if c.model.path:
        folder = r.local_path("model.path", c.model.path, kind="folder")
        if folder and not ((folder / "model_index.json").is_file() or (folder / "transformer").is_dir()):
            r.error("model.path", "not a diffusers folder (no model_index.json or transformer/)", c.model.path, "point it at a folder written by save_pretrained")
    if c.model.dtype == "bfloat16" and c.grid.device == "cpu":
        r.error("model.dtype", "bfloat16 mixed precision needs a GPU; CPU runs train in float32", "bfloat16", 'set model.dtype = "float32" or grid.device = "cuda"')
    r.at_least("model.config.parallelism.data_parallel_shard_degree", c.model.config.parallelism.data_parallel_shard_degree, 1)
    r.at_least("grid.nodes", c.grid.nodes, 1)
    r.at_least("grid.gpus_per_node", c.grid.gpus_per_node, 1)
    r.positive("grid.timeout_s", c.grid.timeout_s)
    if c.grid.timeout_s > 0 and not c.grid.timeout_s <= GRID_TIMEOUT_MAX_S:
        r.error("grid.timeout_s", f"must be finite and at most {GRID_TIMEOUT_MAX_S} s (7 days)", c.grid.timeout_s,
                "a collective that takes longer is stuck; use e.g. 600, or 3600 for very slow checkpoint loads")
    _seed("job.seed", c.job.seed, r)
    r.at_least("grid.cpus_per_rank", c.grid.cpus_per_rank, 0)
    _optimizer(c.rl.optimizer, r)
    _init_from(c.rl.init_from, r)
    for i, key in enumerate(c.rl.init_keys_to_skip_loading):
        if not key.strip():
            r.error(f"rl.init_keys_to_skip_loading[{i}]", "empty key pattern", key, "remove it")


def _seed(path: str, value: int, r: _Rules) -> None:
    if not 0 <= value <= SEED_MAX:
        r.error(path, "must be in [0, 2**63 - 1], a non-negative 64-bit integer", value, "use e.g. 0")


def _optimizer(o: schema.OptimizerConfig, r: _Rules) -> None:
    r.positive("rl.optimizer.lr", o.lr)
    r.at_least("rl.optimizer.weight_decay", o.weight_decay, 0)
    r.positive("rl.optimizer.eps", o.eps)
    r.at_least("rl.optimizer.grad_clip", o.grad_clip, 0)
    r.at_least("rl.optimizer.warmup_steps", o.warmup_steps, 0)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        r.error("rl.optimizer.betas", "must be two numbers in [0, 1)", o.betas, "use e.g. [0.9, 0.999]")


PRESET_SCHEME = "preset:"


def _init_from(value: str, r: _Rules) -> None:
    if value.startswith(PRESET_SCHEME):
        import typing

        from cosmos_rl.config.schema import ModelConfig

        known = typing.get_args(attrs_field_type(ModelConfig, "preset"))
        if value[len(PRESET_SCHEME):] not in known:
            r.error("rl.init_from", "unknown preset", value, f"use one of {', '.join(PRESET_SCHEME + k for k in known)}")
    elif value.startswith("s3://"):
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{2,62}(/.*)?", value):
            r.error("rl.init_from", "not a valid s3:// URL", value, "write s3://bucket/prefix")
    elif "://" in value:
        r.error("rl.init_from", "unsupported URL scheme", value, "use a local folder or s3://bucket/prefix")
    elif value:
        r.local_path("rl.init_from", value, kind="folder")


# ---------------------------------------------------------------------------------------- NFT
def nft_shapes(c: schema.RunConfig) -> tuple[dict[str, list[int]] | None, list[tuple[str, str, object, str]]]:
    """Role shapes for NFT, from grid.shapes when given, else grid.num_replicas/grid.ranks."""
    rl, g = c.rl, c.grid
    want = [1, rl.group_size]
    bad: list[tuple[str, str, object, str]] = []
    if g.shapes is not None:
        if g.num_replicas is not None or g.ranks is not None:
            bad.append(("grid.shapes", "given together with grid.num_replicas/grid.ranks", g.shapes, "set either grid.shapes or grid.num_replicas/grid.ranks, not both"))
        if set(g.shapes) != {"policy", "rollout"}:
            bad.append(("grid.shapes", "must name exactly the roles policy and rollout", sorted(g.shapes), f"write {{policy = {want}, rollout = {want}}}"))
        for role in ("policy", "rollout"):
            if role in g.shapes and g.shapes[role] != want:
                bad.append((f"grid.shapes.{role}", f"NFT needs (1, group_size) = {tuple(want)}", g.shapes[role], f"set grid.shapes.{role} = {want}"))
        return (None if bad else {"policy": want, "rollout": want}), bad
    replicas = 1 if g.num_replicas is None else g.num_replicas
    ranks = rl.group_size if g.ranks is None else g.ranks
    if replicas != 1:
        bad.append(("grid.num_replicas", "NFT runs one execution replica", g.num_replicas, "set grid.num_replicas = 1 or remove it"))
    if ranks != rl.group_size:
        bad.append(("grid.ranks", f"must equal rl.group_size ({rl.group_size}): one sample per model rank", g.ranks, f"set grid.ranks = {rl.group_size} or remove it"))
    return (None if bad else {"policy": [replicas, ranks], "rollout": [replicas, ranks]}), bad


def _one_reward(rl: schema.NFTConfig, r: _Rules) -> None:
    if not rl.reward.revision:
        r.error("rl.reward.revision", "required: the provider's revision is part of the run identity", "", "set rl.reward.revision to the revision the service declares")
    if rl.reward.url and not re.match(r"https?://", rl.reward.url):
        r.error("rl.reward.url", "must be an http:// or https:// URL", rl.reward.url, "e.g. http://127.0.0.1:8000, or empty for the built-in service")
    if not rl.reward.url and rl.reward.name not in BUILTIN_REWARDS:
        r.error("rl.reward.name", "not a built-in reward", rl.reward.name, f"use one of {', '.join(show(n) for n in BUILTIN_REWARDS)}")
    r.positive("rl.reward.timeout_s", rl.reward.timeout_s)
    r.at_least("rl.reward.max_retries", rl.reward.max_retries, 0)
    r.at_least("rl.reward.backoff_s", rl.reward.backoff_s, 0)
    if rl.reward.token_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rl.reward.token_env):
        r.error("rl.reward.token_env", "must be an environment variable name", rl.reward.token_env, "e.g. REWARD_TOKEN")
    if rl.reward_combine != "weighted_sum":
        r.warn("rl.reward_combine", "has no effect with one reward ([rl.reward]); it combines the [[rl.rewards]] tables", rl.reward_combine, "remove it")


def _reward_terms(c: schema.RunConfig, rl: schema.NFTConfig, r: _Rules) -> None:
    """[[rl.rewards]]: several rewards, each its own service (or its own built-in one)."""
    if rl.reward != schema.RewardConfig():
        r.error("rl.rewards", "give either [rl.reward] (one reward) or [[rl.rewards]] (several), not both", "both",
                "move the [rl.reward] settings into a [[rl.rewards]] table and remove [rl.reward]")
    seen: set[str] = set()
    for i, t in enumerate(rl.rewards):
        if not t.name:
            r.error(f"rl.rewards[{i}].name", "required: the reward the service computes", "", 'set e.g. name = "brightness"')
        elif t.name in seen:
            r.error(f"rl.rewards[{i}].name", "names a reward listed before; list each reward once", t.name, "remove the repeated table")
        seen.add(t.name)
        if not (math.isfinite(t.weight) and t.weight > 0):
            r.error(f"rl.rewards[{i}].weight", "must be a finite number > 0", t.weight, "set e.g. weight = 1.0")
        if not t.revision:
            r.error(f"rl.rewards[{i}].revision", "required: the provider's revision is part of the run identity", "", "set it to the revision the service declares")
        if t.url and not re.match(r"https?://", t.url):
            r.error(f"rl.rewards[{i}].url", "must be an http:// or https:// URL", t.url, "e.g. http://127.0.0.1:8000, or empty for the built-in service")
        if t.url and t.model:
            r.error(f"rl.rewards[{i}].model", "only for the built-in service (empty url); a service at a URL loads its own models", t.model, "remove model, or clear url")
        if not t.url:
            _builtin_term(c, t, i, r)
        r.positive(f"rl.rewards[{i}].timeout_s", t.timeout_s)
        r.at_least(f"rl.rewards[{i}].max_retries", t.max_retries, 0)
        r.at_least(f"rl.rewards[{i}].backoff_s", t.backoff_s, 0)
        if t.token_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t.token_env):
            r.error(f"rl.rewards[{i}].token_env", "must be an environment variable name", t.token_env, "e.g. REWARD_TOKEN")


def _builtin_term(c: schema.RunConfig, t: schema.WeightedRewardConfig, i: int, r: _Rules) -> None:
    if t.model:
        if t.name not in MODEL_REWARDS:
            r.error(f"rl.rewards[{i}].name", "not a model reward the built-in service can load", t.name, f"use one of {', '.join(show(n) for n in MODEL_REWARDS)}")
        r.local_path(f"rl.rewards[{i}].model", t.model, kind="folder")
        if not t.reward_revision:
            r.warn(f"rl.rewards[{i}].reward_revision", "not pinned: a changed model in the folder would pass as the same reward", "",
                   "set it to the revision `cosmos-rl reward serve --revision REV --model NAME=FOLDER` prints for the folder")
    elif t.name in MODEL_REWARDS:
        r.error(f"rl.rewards[{i}].model", "required: the built-in service loads a model reward from a local folder", "", "set model to the folder, or url to a service that serves it")
    elif t.name and t.name not in BUILTIN_REWARDS:
        r.error(f"rl.rewards[{i}].name", "not a built-in reward", t.name, f"use one of {', '.join(show(n) for n in BUILTIN_REWARDS)}, a model reward with model, or a url")
    if c.grid.nodes > 1:
        r.error(f"rl.rewards[{i}].url", "the built-in reward service listens on 127.0.0.1 of the driver's node, which other nodes cannot reach", "",
                "run `cosmos-rl reward serve --host 0.0.0.0 --token-env REWARD_TOKEN` where every node can reach it and set the url")


def _nft(c: schema.RunConfig, rl: schema.NFTConfig, r: _Rules) -> None:
    g = c.grid
    if g.backend != "ray":
        r.error("grid.backend", "NFT's five roles are one Ray actor group", g.backend, 'set grid.backend = "ray"')
    if g.grouping != "single":
        r.error("grid.grouping", "NFT shares one process per rank among all roles", g.grouping, 'set grid.grouping = "single"')
    if g.gpu_placement != "colocated":
        r.error("grid.gpu_placement", "NFT's actors form one colocated FSDP world", g.gpu_placement, 'set grid.gpu_placement = "colocated"')
    if g.gpus_per_role is not None:
        r.error("grid.gpus_per_role", "colocated NFT takes no per-role GPU overrides", g.gpus_per_role, "remove grid.gpus_per_role")
    r.at_least("rl.group_size", rl.group_size, 2, "set rl.group_size to 2 or more (advantages compare samples within a group)")
    for path, problem, got, fix in nft_shapes(c)[1]:
        r.error(path, problem, got, fix)
    if g.device == "cuda" and g.nodes * g.gpus_per_node != rl.group_size:
        r.error("grid.gpus_per_node", f"NFT puts one rank on each GPU, so grid.nodes * grid.gpus_per_node must equal rl.group_size ({rl.group_size})",
                g.gpus_per_node, f"use {g.nodes} node(s) x {rl.group_size / g.nodes:g} GPUs, or change rl.group_size")
    if g.nodes > 1 and not rl.reward.url and not rl.rewards:
        r.error("rl.reward.url", "the built-in reward service listens on 127.0.0.1 of the driver's node, which other nodes cannot reach", "",
                "run `cosmos-rl reward serve --host 0.0.0.0 --token-env REWARD_TOKEN` (or your own service) where every node can reach it and set rl.reward.url")
    dp = c.model.config.parallelism.data_parallel_shard_degree
    if dp not in (1, rl.group_size):
        r.error("model.config.parallelism.data_parallel_shard_degree", f"NFT shards over its group_size ({rl.group_size}) ranks", dp, "remove it (derived) or set it to rl.group_size")
    if rl.modality == "video":
        if rl.profile:
            r.error("rl.profile", "video NFT takes no profile", rl.profile, "remove rl.profile")
        if rl.init_keys_to_skip_loading:
            r.error("rl.init_keys_to_skip_loading", "the video contract requires it to be empty", rl.init_keys_to_skip_loading, "remove it")
        r.error("rl.modality", "video NFT is not included in this release", "video", 'set rl.modality = "image" with a T2I rl.profile')
    else:
        known = ", ".join(show(p) for p in schema.T2I_PROFILES)
        if rl.profile not in schema.T2I_PROFILES:
            r.error("rl.profile", "image NFT needs a known T2I profile", rl.profile, f"use one of {known}")
        elif schema.T2I_PROFILES[rl.profile]["image_size"] != c.model.image_size:
            size = schema.T2I_PROFILES[rl.profile]["image_size"]
            r.error("model.image_size", f"profile {show(rl.profile)} fixes the image size at {size}", c.model.image_size, f"set model.image_size = {size}")
    if not rl.init_from:
        r.error("rl.init_from", "required: NFT always starts from a base checkpoint", "", "set rl.init_from to a diffusers folder, DCP folder or s3:// URL")
    if rl.rewards:
        _reward_terms(c, rl, r)
    else:
        _one_reward(rl, r)
    if rl.scheduler != "unipc":
        r.error("rl.scheduler", "only the UniPC sampler is supported", rl.scheduler, 'set rl.scheduler = "unipc"')
    if rl.old.build_old and c.model.lora.rank == 0:
        r.error("model.lora.rank", "NFT keeps the moving old policy as a second LoRA adapter, so it needs LoRA", 0,
                "set model.lora.rank > 0 (or rl.old.build_old = false)")
    if rl.old.build_old and rl.old.update_every < 1:
        r.error("rl.old.update_every", "must be >= 1 when rl.old.build_old is on", rl.old.update_every, "set rl.old.update_every = 1 or more")
    if not 0 <= rl.old.decay_rate:
        r.error("rl.old.decay_rate", "must be >= 0", rl.old.decay_rate, "use e.g. 0.001")
    if not 0 <= rl.old.decay_cap < 1:
        r.error("rl.old.decay_cap", "must be in [0, 1)", rl.old.decay_cap, "use e.g. 0.5")
    if rl.ref.update_every != 0:
        r.error("rl.ref.update_every", "the reference is frozen", rl.ref.update_every, "set rl.ref.update_every = 0")
    if not rl.advantage_low < rl.advantage_high:
        r.error("rl.advantage_low", f"must be below rl.advantage_high ({rl.advantage_high})", rl.advantage_low, "e.g. -5.0 and 5.0")
    r.positive("rl.r_tau", rl.r_tau)
    r.positive("rl.beta", rl.beta)
    r.at_least("rl.kl_beta", rl.kl_beta, 0)
    r.positive("rl.policy_loss_scale", rl.policy_loss_scale)
    r.at_least("rl.sample_steps", rl.sample_steps, 2)
    r.positive("rl.sampler_shift", rl.sampler_shift)
    r.at_least("rl.guidance", rl.guidance, 0)
    r.at_least("rl.prompts_per_step", rl.prompts_per_step, 1)
    r.at_least("rl.sample_grid_every", rl.sample_grid_every, 0)
    if not 0 <= rl.timesteps_per_sample <= rl.sample_steps - 1:
        r.error("rl.timesteps_per_sample", f"must be in [0, rl.sample_steps - 1 = {rl.sample_steps - 1}]", rl.timesteps_per_sample, "0 trains on every sampler timestep but the last")
    if rl.prompts.file:
        r.local_path("rl.prompts.file", rl.prompts.file, kind="file")


# ---------------------------------------------------------------------------------------- DPO
def _sources(data: schema.PreferenceDataConfig) -> list[str]:
    used = []
    if data.synthetic_pairs:
        used.append("synthetic_pairs")
    if data.jsonl:
        used.append("jsonl")
    if data.shards:
        used.append("shards")
    if data.factory:
        used.append("factory")
    return used


def _data_source(prefix: str, data: schema.PreferenceDataConfig, r: _Rules, *, needs_membership: bool) -> None:
    r.at_least(f"{prefix}.synthetic_pairs", data.synthetic_pairs, 0)
    _seed(f"{prefix}.synthetic_seed", data.synthetic_seed, r)
    used = _sources(data)
    files = [s for s in used if s != "synthetic_pairs"]
    if data.synthetic_pairs and files:
        r.warn(f"{prefix}.synthetic_pairs", f"non-zero, so {', '.join(prefix + '.' + f for f in files)} is ignored", data.synthetic_pairs, "set it to 0 to train on the file source")
    elif len(files) > 1:
        r.error(prefix, "more than one data source", files, "keep exactly one of jsonl, shards, factory (or synthetic_pairs)")
    if data.synthetic_pairs:
        return
    if data.jsonl:
        r.local_path(f"{prefix}.jsonl", data.jsonl, kind="file")
    for i, shard in enumerate(data.shards):
        if "{" not in shard:  # brace-expanded shard patterns are checked when opened
            r.local_path(f"{prefix}.shards[{i}]", shard, kind="file")
    if data.factory:
        _factory(f"{prefix}.factory", data.factory, r, needs_membership=needs_membership)


def _factory(path: str, spec: str, r: _Rules, *, needs_membership: bool) -> None:
    from cosmos_rl.data.factory_spec import (
        FactorySpecError,
        exposes_membership,
        resolve_factory,
    )

    try:
        factory = resolve_factory(spec, path)  # imports the user's module: the one import a manifest can cause
    except FactorySpecError as exc:
        if exc.kind == "format":
            r.error(path, "must be module:function", spec, "e.g. my_data.pairs:make_source")
        elif exc.kind in ("not_found", "import_failed"):
            cause = exc.cause if exc.cause is not None else exc
            r.error(path, f"cannot import module {exc.module!r}: {type(cause).__name__}: {cause}", spec, "make it importable (PYTHONPATH)")
        else:
            r.error(path, f"module {exc.module!r} has no function {exc.attr!r}", spec, "name a callable that returns a pair source")
        return
    if needs_membership and not exposes_membership(factory):
        r.error(path, "used with validation, so it must expose a metadata-only membership_ids()", spec,
                "give the returned source (or the factory) a membership_ids() method; see docs/dpo.md")


def _data_parallel_grid(c: schema.RunConfig, r: _Rules) -> None:
    """DPO and SFT: every rank trains its share of the step (data parallel, FSDP2)."""
    g, name = c.grid, c.rl.algorithm.upper()
    if g.grouping == "per_role" and g.backend != "ray":
        r.error("grid.grouping", "per_role needs grid.backend = \"ray\" (under local there is one process)", g.grouping, 'set grid.grouping = "single" or grid.backend = "ray"')
    if g.gpu_placement != "colocated":
        r.error("grid.gpu_placement", f"{name} runs its roles colocated", g.gpu_placement, 'set grid.gpu_placement = "colocated"')
    for key in ("num_replicas", "ranks", "shapes", "gpus_per_role"):
        if getattr(g, key) is not None:
            r.error(f"grid.{key}", f"an NFT role-shape setting; {name}'s width is model.config.parallelism.data_parallel_shard_degree", getattr(g, key), f"remove grid.{key}")
    dp = c.model.config.parallelism.data_parallel_shard_degree
    if dp != g.nodes * g.gpus_per_node:
        r.error("model.config.parallelism.data_parallel_shard_degree", f"must equal grid.nodes * grid.gpus_per_node = {g.nodes} * {g.gpus_per_node}", dp,
                f"set it to {g.nodes * g.gpus_per_node} or change grid.nodes/grid.gpus_per_node")
    if g.backend == "local" and g.nodes > 1 and not (g.rdzv_endpoint or os.environ.get(RDZV_ENV)):
        r.error("grid.rdzv_endpoint", "multi-node torchrun needs the operator's rendezvous endpoint", "", f"set grid.rdzv_endpoint = \"host:port\" or export {RDZV_ENV}")


def _dpo(c: schema.RunConfig, rl: schema.DPOConfig, r: _Rules) -> None:
    _data_parallel_grid(c, r)
    dp = c.model.config.parallelism.data_parallel_shard_degree
    r.positive("rl.beta", rl.beta)
    r.at_least("rl.pairs_per_step", rl.pairs_per_step, 1)
    if rl.pairs_per_step >= 1 and dp >= 1 and rl.pairs_per_step % dp:
        r.error("rl.pairs_per_step", f"must split evenly over the {dp} ranks", rl.pairs_per_step, f"use a multiple of {dp}")
    validating = rl.validation.every > 0
    if not _sources(rl.data):
        r.error("rl.data", "no preference data source", "", "set rl.data.synthetic_pairs, rl.data.jsonl, rl.data.shards or rl.data.factory")
    _data_source("rl.data", rl.data, r, needs_membership=validating)
    r.at_least("rl.validation.every", rl.validation.every, 0)
    if validating:
        r.at_least("rl.validation.max_pairs", rl.validation.max_pairs, 1)
        if not _sources(rl.validation.data):
            r.error("rl.validation.data", "validation needs an explicit held-out source (never an implicit split)", "",
                    "set rl.validation.data.jsonl/shards/factory/synthetic_pairs, or rl.validation.every = 0")
        else:
            _data_source("rl.validation.data", rl.validation.data, r, needs_membership=True)
        if rl.data.synthetic_pairs and rl.validation.data.synthetic_pairs and rl.data.synthetic_seed == rl.validation.data.synthetic_seed:
            r.error("rl.validation.data.synthetic_seed", "equals rl.data.synthetic_seed, so validation pairs are training pairs", rl.validation.data.synthetic_seed,
                    "give the held-out generator another seed")


# ---------------------------------------------------------------------------------------- SFT
def _sft(c: schema.RunConfig, rl: schema.SFTConfig, r: _Rules) -> None:
    _data_parallel_grid(c, r)
    if c.grid.backend != "local":
        r.error("grid.backend", "SFT runs under torchrun only", c.grid.backend, 'set grid.backend = "local"')
    dp = c.model.config.parallelism.data_parallel_shard_degree
    r.at_least("rl.samples_per_step", rl.samples_per_step, 1)
    if rl.samples_per_step >= 1 and dp >= 1 and rl.samples_per_step % dp:
        r.error("rl.samples_per_step", f"must split evenly over the {dp} ranks", rl.samples_per_step, f"use a multiple of {dp}")
    if not 0 <= rl.caption_dropout < 1:
        r.error("rl.caption_dropout", "must be in [0, 1)", rl.caption_dropout, "use e.g. 0.1 (0 trains no unconditional prompt)")
    if rl.train == "vae" and c.model.lora.rank > 0:
        r.error("model.lora.rank", "rl.train = \"vae\" trains every VAE weight; LoRA adapts the transformer only", c.model.lora.rank,
                "set model.lora.rank = 0")
    data = rl.data
    if not data.shards and not data.jsonl:
        r.error("rl.data", "no image-caption data source", "", "set rl.data.shards or rl.data.jsonl")
    elif data.shards and data.jsonl:
        r.error("rl.data", "more than one data source", ["jsonl", "shards"], "keep exactly one of rl.data.jsonl and rl.data.shards")
    if data.jsonl:
        r.local_path("rl.data.jsonl", data.jsonl, kind="file")
    for i, shard in enumerate(data.shards):
        if "{" not in shard:  # brace-expanded shard patterns are checked when opened
            r.local_path(f"rl.data.shards[{i}]", shard, kind="file")
