"""Every cross-field rule of the specs, checked before any worker starts.

``check(config, base_dir)`` returns every problem at once (errors and warnings); it does cheap
filesystem checks only and never imports torch, ray or diffusers.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
import typing
from pathlib import Path

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.core import schema
from cosmos_rl.core.paths import resolve_path
from cosmos_rl.config.preflight_data import _data_source, _sources
from cosmos_rl.config.preflight_i2v import first_frame_rules
from cosmos_rl.config.preflight_media import folder_config_rules, folder_vae_rules, frame_rules, modality_rule
from cosmos_rl.config.preflight_numbers import finite_rule
from cosmos_rl.config.preflight_optimizer import optimizer_rules
from cosmos_rl.config.preflight_rules import Rules, seed_rule
from cosmos_rl.config.preflight_sft import vae_stage_rules
from cosmos_rl.config.preflight_rewards import WEIGHT_FREE_REWARDS, _one_reward, _reward_terms
from cosmos_rl.suites import registry as suites
from cosmos_rl.core.problems import Problem, show
from cosmos_rl.models.layout import (
    PIPELINE_INDEX,
    PRESET_SCHEME,
    S3_SCHEME,
    SCHEDULER_CONFIG,
    is_pipeline_folder,
    read_json,
    scheduler_problem,
)

RDZV_ENV = "COSMOS_RL_RDZV_ENDPOINT"
# gloo turns a timeout into an int64-nanosecond deadline, which wraps past ~292 years (9.2e9 s) and
# then times out at once; Ray turns one into int64 milliseconds and cannot take inf. A week is far
# beyond any honest collective, so anything longer is a typo or an attempt at "never".
GRID_TIMEOUT_MAX_S = 7 * 24 * 3600


def check(config: schema.RunConfig, base_dir: Path | str = ".") -> list[Problem]:
    rules = Rules(Path(base_dir))
    finite_rule(config, rules)
    _common(config, rules)
    algorithm = algorithms.of(config)
    if config.model.num_frames > 1 and not algorithm.video and not hasattr(config.rl, "modality"):
        # An algorithm with rl.modality (NFT) says this under that key instead.
        video_ones = ", ".join(f'"{a.name}"' for a in map(algorithms.get, algorithms.BUILT_IN) if a.video)
        rules.error("model.num_frames", f"rl.algorithm = \"{algorithm.name}\" does not train video in this release", config.model.num_frames,
                    f"set model.num_frames = 1, or train video with rl.algorithm = {video_ones}")
    own_rules = algorithm.resolve("preflight")
    if own_rules is not None:
        own_rules(config, config.rl, rules)
    _eval(config, config.rl.eval, rules)
    return rules.problems


def machine_problems(config: schema.RunConfig, visible_gpus: int) -> list[Problem]:
    """Rules about the machine `train` runs on, not the manifest (so `validate` never runs them: a
    GPU manifest validates on a laptop). `visible_gpus` is what torch.cuda.device_count() says here;
    only runs whose ranks start on this machine (torchrun, or a local Ray cluster) are judged."""
    r = Rules(Path("."))
    g = config.grid
    here = g.backend == "local" or not (g.ray_address or os.environ.get("RAY_ADDRESS"))
    if here and g.device == "cuda" and visible_gpus < g.gpus_per_node:
        r.error("grid.device", f"\"cuda\" with grid.gpus_per_node = {g.gpus_per_node}, but this machine has {visible_gpus} visible CUDA GPU(s)", "cuda",
                'run on a machine with the GPUs (check CUDA_VISIBLE_DEVICES and nvidia-smi), or, to try it on a CPU, set grid.device = "cpu" (model.dtype = "float32" is faster there)')
    return r.problems


def _lora_targets(names: list[str], r: Rules) -> None:
    from cosmos_rl.models.towers import TOWERS, target_problem

    for index, name in enumerate(names):
        problem = target_problem(name)
        if problem is not None:
            near = difflib.get_close_matches(str(name), list(TOWERS), n=1)
            fix = f'did you mean "{near[0]}"?' if near else f"use a tower name ({', '.join(TOWERS)}) or a module name such as to_q or add_q_proj"
            r.error(f"model.lora.target_modules[{index}]", problem, name, fix)
        elif name not in TOWERS and difflib.get_close_matches(name, list(TOWERS), n=1, cutoff=0.8):
            near = difflib.get_close_matches(name, list(TOWERS), n=1, cutoff=0.8)[0]
            r.error(f"model.lora.target_modules[{index}]", f"{name!r} is no module of a Cosmos3 layer and is one letter or two from the tower name {near!r}", name, f'did you mean "{near}"?')
    if len(set(names)) != len(names):
        r.error("model.lora.target_modules", "names an entry twice", list(names), "list each name once")


# --------------------------------------------------------------------------------------- both
def _common(c: schema.RunConfig, r: Rules) -> None:
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
    _lora_targets(c.model.lora.target_modules, r)
    _media_size(c.model, r)
    frame_rules(c.model, r)
    r.at_least("model.config.parallelism.data_parallel_shard_degree", c.model.config.parallelism.data_parallel_shard_degree, 1)
    r.at_least("grid.nodes", c.grid.nodes, 1)
    r.at_least("grid.gpus_per_node", c.grid.gpus_per_node, 1)
    r.positive("grid.timeout_s", c.grid.timeout_s)
    if c.grid.timeout_s > 0 and not c.grid.timeout_s <= GRID_TIMEOUT_MAX_S:
        r.error("grid.timeout_s", f"must be finite and at most {GRID_TIMEOUT_MAX_S} s (7 days)", c.grid.timeout_s,
                "a collective that takes longer is stuck; use e.g. 600, or 3600 for very slow checkpoint loads")
    seed_rule("job.seed", c.job.seed, r)
    r.at_least("grid.cpus_per_rank", c.grid.cpus_per_rank, 0)
    optimizer_rules(c.rl, r)
    _model_and_base(c, r)
    for i, key in enumerate(c.rl.init_keys_to_skip_loading):
        if not key.strip():
            r.error(f"rl.init_keys_to_skip_loading[{i}]", "empty key pattern", key, "remove it")


def _frame_size(m: schema.ModelConfig) -> tuple[int | None, int | None]:
    return (m.height if m.height is not None else m.image_size, m.width if m.width is not None else m.image_size)


def _media_size(m: schema.ModelConfig, r: Rules) -> None:
    # image_size is the square shorthand for height = width: one or the other, each a multiple of 16.
    given = [k for k, v in (("model.height", m.height), ("model.width", m.width)) if v is not None]
    if m.image_size is not None and given:
        r.error("model.image_size", f"given together with {' and '.join(given)}", m.image_size,
                f"give model.image_size (a square) or model.height and model.width, not both: remove model.image_size or {' and '.join(given)}")
    elif m.image_size is None and len(given) == 1:
        missing = "model.width" if given == ["model.height"] else "model.height"
        r.error(missing, f"missing: {given[0]} is set, and the size needs both sides",
                fix=f"set {missing} too (or only model.image_size, for a square image)")
    for key, value in (("model.image_size", m.image_size), ("model.height", m.height), ("model.width", m.width)):
        if value is not None and (value < 16 or value % 16):
            r.error(key, "must be a multiple of 16, at least 16", value, "use e.g. 32 or 512")


def _model_folder(value: str, r: Rules) -> Path | None:
    folder = r.local_path("model.path", value, kind="folder")
    if folder is None:
        return None
    if not ((folder / PIPELINE_INDEX).is_file() or (folder / "transformer").is_dir()):
        r.error("model.path", "not a diffusers folder (no model_index.json or transformer/)", value, "point it at a folder written by save_pretrained")
        return None
    scheduler = folder / SCHEDULER_CONFIG
    if not scheduler.is_file():
        r.error("model.path", "has no scheduler/scheduler_config.json, so the sampler is unknown", value,
                "point it at the whole pipeline folder (save_pretrained writes scheduler/)")
        return folder
    try:
        problem = scheduler_problem(read_json(scheduler, str(scheduler)))
    except ValueError as exc:
        problem = str(exc)
    if problem:
        r.error("model.path", f"scheduler/scheduler_config.json {problem}", value, "Cosmos3 samples with flow UniPC; use the pipeline's own scheduler folder")
    return folder


def _pipeline_base_conflict(base: Path, folder: Path | None, model: schema.ModelConfig) -> str | None:
    """How a whole-pipeline base contradicts the named model (None when it does not)."""
    if not is_pipeline_folder(base):
        return None  # a weights or DCP base goes into whatever architecture the model names
    if folder is not None and base.resolve() != folder.resolve():
        return f"model.path is {show(model.path)}"
    if not model.path and model.preset is not None:
        return f"the model is model.preset = {show(model.preset)}"
    return None


def _model_and_base(c: schema.RunConfig, r: Rules) -> None:
    """The model is named once (model.path or model.preset), and rl.init_from agrees with it."""
    model, value = c.model, c.rl.init_from
    if not model.path and model.preset is None:
        r.error("model.path", "no model named: set a local diffusers folder here, or model.preset to a built-in preset", "",
                'set model.path = "/path/to/cosmos3-nano" (or model.preset = "tiny" for the CPU smoke model)')
    elif model.path and model.preset is not None:
        r.error("model.preset", "given together with model.path; the model is either a folder or a built-in preset", model.preset,
                "remove model.preset (the folder brings its architecture) or model.path")
    folder = _model_folder(model.path, r) if model.path else None
    if folder is not None:
        folder_config_rules(folder, r)
        folder_vae_rules(model, folder, _frame_size(model), r)

    known = typing.get_args(schema.PresetName)
    if value.startswith(PRESET_SCHEME):
        name = value[len(PRESET_SCHEME):]
        if name not in known:
            r.error("rl.init_from", "unknown preset", value, f"use one of {', '.join(PRESET_SCHEME + k for k in known)}")
        elif model.path:
            r.error("rl.init_from", "names a built-in preset's random weights while model.path names a folder", value,
                    "set rl.init_from to the folder (or a checkpoint of it), or replace model.path by model.preset")
    elif value.startswith(S3_SCHEME):
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{2,62}(/.*)?", value):
            r.error("rl.init_from", "not a valid s3:// URL", value, "write s3://bucket/prefix")
    elif "://" in value:
        r.error("rl.init_from", "unsupported URL scheme", value, "use a local folder or s3://bucket/prefix")
    elif value:
        base = r.local_path("rl.init_from", value, kind="folder")
        named = _pipeline_base_conflict(base, folder, model) if base is not None else None
        if named:
            r.error("rl.init_from", f"is a diffusers pipeline folder, which brings its own architecture, VAE, tokenizer and scheduler, but {named}",
                    value, "set model.path to the same folder (and drop model.preset), or point rl.init_from at its transformer/ subfolder to take only its weights")

    nothing_loaded = not model.path and model.preset is not None and (value == "" or value.startswith(PRESET_SCHEME))
    if nothing_loaded and c.rl.init_keys_to_skip_loading:
        r.error("rl.init_keys_to_skip_loading", "no checkpoint is loaded (the built-in preset's weights are random), so nothing can be skipped",
                c.rl.init_keys_to_skip_loading, "remove it, or set rl.init_from / model.path to the checkpoint it applies to")


# --------------------------------------------------------------------------------------- eval
def _eval(c: schema.RunConfig, e: schema.EvalConfig, r: Rules) -> None:
    """[rl.eval] (every algorithm): evaluation during training (docs/eval.md)."""
    r.at_least("rl.eval.every", e.every, 0, "set rl.eval.every to 0 (off) or a number of steps")
    suite = _eval_suite(c, e, r)  # also names the suite `cosmos-rl eval RUN_DIR` evaluates
    if e.every <= 0:
        return
    if c.job.log_every >= 1 and e.every % c.job.log_every:
        r.error("rl.eval.every", f"must be a multiple of job.log_every ({c.job.log_every}), or its eval/ rows are never written", e.every,
                f"use a multiple of {c.job.log_every}")
    if e.every > c.rl.max_steps >= 1:
        r.warn("rl.eval.every", f"is more than rl.max_steps ({c.rl.max_steps}), so the run never evaluates", e.every, "lower it, or set it to 0")
    r.at_least("rl.eval.seeds", e.seeds, 1)
    r.at_least("rl.eval.per_task", e.per_task, 0, "set rl.eval.per_task to 0 (every held-out prompt) or more")
    r.at_least("rl.eval.hacking_window", e.hacking_window, 2, "set rl.eval.hacking_window to 2 or more (evaluations compared oldest to newest)")
    r.at_least("rl.eval.sample_steps", e.sample_steps, 0, "set rl.eval.sample_steps to 0 (the run's own) or a number of sampler steps")
    if e.guidance is not None:
        r.at_least("rl.eval.guidance", e.guidance, 0, "set rl.eval.guidance to 1 (conditional only) or more, or remove it")
    _eval_reward(c, e, suite, r)
    if e.prompts:
        r.local_path("rl.eval.prompts", e.prompts, kind="file")
        if e.per_task != schema.EvalConfig().per_task:
            r.warn("rl.eval.per_task", "has no effect with rl.eval.prompts (every prompt of the file is used)", e.per_task, "remove it")


def _eval_suite(c: schema.RunConfig, e: schema.EvalConfig, r: Rules):
    """rl.eval.suite: a known suite judging what the run makes (clips or images); the suite itself, or
    None when it is named wrongly (the reward rules then have no suite to hold to)."""
    if not e.suite:
        return None
    try:
        suite = suites.get(e.suite)
    except suites.UnknownSuite as exc:
        r.error("rl.eval.suite", exc.problem, e.suite, exc.fix)
        return None
    clips = c.model.num_frames > 1
    if suite.judges_clips != clips:
        makes, judges = ("clips", "images") if clips else ("images", "clips")
        others = [n for n in suites.BUILT_IN if suites.get(n).judges_clips == clips]
        r.error("rl.eval.suite", f"judges {judges}, and this run makes {makes} (model.num_frames = {c.model.num_frames})", e.suite,
                f"name a suite of {makes} ({', '.join(others)}), or leave rl.eval.suite empty")  # fmt: skip
        return None
    return suite


def _eval_reward(c: schema.RunConfig, e: schema.EvalConfig, suite, r: Rules) -> None:
    """rl.eval.reward: one of the evaluation suite's rewards (its verifier), or for images a weight-free one."""
    try:
        owner = suites.reward_owner(e.reward)
    except suites.UnknownSuite as exc:
        r.error("rl.eval.reward", exc.problem, e.reward, exc.fix)
        return
    if c.model.num_frames > 1:
        if owner is None or not owner.judges_clips:
            clip_suite = suite or suites.for_media(clips=True)
            names = clip_suite.reward_names()
            r.error("rl.eval.reward", f"a video run's evaluation scores clips with the {clip_suite.title} verifier", e.reward,
                    f"set rl.eval.reward = {show(names[0])} (or {show(names[1])})" if len(names) > 1 else f"set rl.eval.reward = {show(names[0])}")  # fmt: skip
            return
    elif (owner is None and e.reward not in WEIGHT_FREE_REWARDS) or (owner is not None and owner.judges_clips):
        names = [*WEIGHT_FREE_REWARDS, *(suite.reward_names() if suite else suites.builtin_reward_names(clips=False))]
        r.error("rl.eval.reward", "not a built-in weight-free reward (evaluation scores in-process)", e.reward,
                f"use one of {', '.join(show(n) for n in names)}")
        return
    if suite is not None and owner is not None and owner.name != suite.name:
        r.error("rl.eval.reward", f"is a reward of the suite {owner.name!r}, and rl.eval.suite names {suite.name!r}", e.reward,
                f"set rl.eval.reward to one of {', '.join(show(n) for n in suite.reward_names())}"
                + ("" if suite.judges_clips else " or a weight-free reward"))  # fmt: skip


# ---------------------------------------------------------------------------------------- NFT
def nft_shapes(c: schema.RunConfig) -> tuple[dict[str, list[int]] | None, list[tuple[str, str, object, str]]]:
    """Role shapes of an online run (NFT's topology), from grid.shapes when given, else grid.num_replicas/grid.ranks."""
    rl, g, name = c.rl, c.grid, _name(c.rl)
    want = [1, rl.group_size]
    bad: list[tuple[str, str, object, str]] = []
    if g.shapes is not None:
        if g.num_replicas is not None or g.ranks is not None:
            bad.append(("grid.shapes", "given together with grid.num_replicas/grid.ranks", g.shapes, "set either grid.shapes or grid.num_replicas/grid.ranks, not both"))
        if set(g.shapes) != {"policy", "rollout"}:
            bad.append(("grid.shapes", "must name exactly the roles policy and rollout", sorted(g.shapes), f"write {{policy = {want}, rollout = {want}}}"))
        for role in ("policy", "rollout"):
            if role in g.shapes and g.shapes[role] != want:
                bad.append((f"grid.shapes.{role}", f"{name} needs (1, group_size) = {tuple(want)}", g.shapes[role], f"set grid.shapes.{role} = {want}"))
        return (None if bad else {"policy": want, "rollout": want}), bad
    replicas = 1 if g.num_replicas is None else g.num_replicas
    ranks = rl.group_size if g.ranks is None else g.ranks
    if replicas != 1:
        bad.append(("grid.num_replicas", f"{name} runs one execution replica", g.num_replicas, "set grid.num_replicas = 1 or remove it"))
    if ranks != rl.group_size:
        bad.append(("grid.ranks", f"must equal rl.group_size ({rl.group_size}): one sample per model rank", g.ranks, f"set grid.ranks = {rl.group_size} or remove it"))
    return (None if bad else {"policy": [replicas, ranks], "rollout": [replicas, ranks]}), bad


def nft_rules(c: schema.RunConfig, rl: schema.NFTConfig, r: Rules) -> None:
    """NFT's rules (nft.md): the online rules, then modality/profile, the sampler type and the objective's knobs."""
    online_rules(c, rl, r)
    modality_rule(rl, c.model, r)
    if rl.modality == "video" and c.model.num_frames > 1:
        # The spec's video contract: frames and size come from [model] alone, and the model is built
        # with every head its checkpoint has (a Nano folder's sound and action heads, unused).
        if rl.profile:
            r.error("rl.profile", "video NFT takes no profile (a profile fixes T2I production coordinates; a clip's frames and size come from [model])",
                    rl.profile, "remove rl.profile (set model.num_frames and model.image_size instead)")
        if rl.init_keys_to_skip_loading:
            r.error("rl.init_keys_to_skip_loading", "must be empty for video NFT: the video model is built with every head of its checkpoint (sound and action heads present, unused)",
                    rl.init_keys_to_skip_loading, "remove rl.init_keys_to_skip_loading")
    elif rl.modality == "image":
        known = ", ".join(show(p) for p in schema.T2I_PROFILES)
        if rl.profile not in schema.T2I_PROFILES:
            r.error("rl.profile", "image NFT needs a known T2I profile", rl.profile, f"use one of {known}")
        elif _frame_size(c.model) != (schema.T2I_PROFILES[rl.profile]["image_size"],) * 2:
            size = schema.T2I_PROFILES[rl.profile]["image_size"]
            key, got = ("model.image_size", c.model.image_size) if c.model.image_size is not None else ("model.height", [c.model.height, c.model.width])
            r.error(key, f"profile {show(rl.profile)} fixes the image size at {size}", got, f"set model.image_size = {size}")
    first_frame_rules(c, rl, r)
    if rl.scheduler != "unipc":
        r.error("rl.scheduler", "only the UniPC sampler is supported", rl.scheduler, 'set rl.scheduler = "unipc"')
    if not rl.advantage_low < rl.advantage_high:
        r.error("rl.advantage_low", f"must be below rl.advantage_high ({rl.advantage_high})", rl.advantage_low, "e.g. -5.0 and 5.0")
    r.positive("rl.r_tau", rl.r_tau)
    r.positive("rl.beta", rl.beta)
    r.at_least("rl.kl_beta", rl.kl_beta, 0)
    r.positive("rl.policy_loss_scale", rl.policy_loss_scale)
    if not 0 <= rl.timesteps_per_sample <= rl.sample_steps:
        r.error("rl.timesteps_per_sample", f"must be in [0, rl.sample_steps = {rl.sample_steps}]", rl.timesteps_per_sample, "0 trains on all but one of the sampler's timesteps, the one left out drawn at random")


def online_rules(c: schema.RunConfig, rl: schema.OnlineRLBase, r: Rules) -> None:
    """Every online algorithm's rules (nft.md section 4 and its reward, old/ref and sampler rules):
    one colocated Ray actor group, one sample per rank, a base checkpoint, pinned reward services."""
    g, name = c.grid, _name(rl)
    if g.backend != "ray":
        r.error("grid.backend", f"{name}'s five roles are one Ray actor group", g.backend, 'set grid.backend = "ray"')
    if g.grouping != "single":
        r.error("grid.grouping", f"{name} shares one process per rank among all roles", g.grouping, 'set grid.grouping = "single"')
    if g.gpu_placement != "colocated":
        r.error("grid.gpu_placement", f"{name}'s actors form one colocated FSDP world", g.gpu_placement, 'set grid.gpu_placement = "colocated"')
    if g.gpus_per_role is not None:
        r.error("grid.gpus_per_role", f"colocated {name} takes no per-role GPU overrides", g.gpus_per_role, "remove grid.gpus_per_role")
    r.at_least("rl.group_size", rl.group_size, 2, "set rl.group_size to 2 or more (advantages compare samples within a group)")
    for path, problem, got, fix in nft_shapes(c)[1]:
        r.error(path, problem, got, fix)
    # A count below 1 is already refused above; a product of it would suggest a negative fix.
    if g.device == "cuda" and g.nodes >= 1 and g.gpus_per_node >= 1 and g.nodes * g.gpus_per_node != rl.group_size:
        r.error("grid.gpus_per_node", f"{name} puts one rank on each GPU, so grid.nodes * grid.gpus_per_node must equal rl.group_size ({rl.group_size})",
                g.gpus_per_node, f"use {g.nodes} node(s) x {rl.group_size / g.nodes:g} GPUs, or change rl.group_size")
    if g.nodes > 1 and not rl.reward.url and not rl.rewards:
        r.error("rl.reward.url", "the built-in reward service listens on 127.0.0.1 of the driver's node, which other nodes cannot reach", "",
                "run `cosmos-rl reward serve --host 0.0.0.0 --token-env REWARD_TOKEN` (or your own service) where every node can reach it and set rl.reward.url")
    dp = c.model.config.parallelism.data_parallel_shard_degree
    if dp not in (1, rl.group_size):
        r.error("model.config.parallelism.data_parallel_shard_degree", f"{name} shards over its group_size ({rl.group_size}) ranks", dp, "remove it (derived) or set it to rl.group_size")
    if not rl.init_from:
        r.error("rl.init_from", f"required: {name} always starts from a base checkpoint", "", "set rl.init_from to a diffusers folder, DCP folder or s3:// URL")
    if rl.rewards:
        _reward_terms(c, rl, r)
    else:
        _one_reward(c, rl, r)
    if rl.old.build_old and c.model.lora.rank == 0:
        r.error("model.lora.rank", f"{name} keeps the moving old policy as a second LoRA adapter, so it needs LoRA", 0,
                "set model.lora.rank > 0 (or rl.old.build_old = false)")
    if rl.old.build_old and rl.old.update_every < 1:
        r.error("rl.old.update_every", "must be >= 1 when rl.old.build_old is on", rl.old.update_every, "set rl.old.update_every = 1 or more")
    if not 0 <= rl.old.decay_rate:
        r.error("rl.old.decay_rate", "must be >= 0", rl.old.decay_rate, "use e.g. 0.001")
    if not 0 <= rl.old.decay_cap < 1:
        r.error("rl.old.decay_cap", "must be in [0, 1)", rl.old.decay_cap, "use e.g. 0.5")
    if rl.ref.update_every != 0:
        r.error("rl.ref.update_every", "the reference is frozen", rl.ref.update_every, "set rl.ref.update_every = 0")
    r.at_least("rl.sample_steps", rl.sample_steps, 2)
    if rl.sampler_shift is not None:
        r.positive("rl.sampler_shift", rl.sampler_shift)
    r.at_least("rl.guidance", rl.guidance, 0)
    r.at_least("rl.prompts_per_step", rl.prompts_per_step, 1)
    r.at_least("rl.sample_grid_every", rl.sample_grid_every, 0)
    if rl.prompts.file:
        r.local_path("rl.prompts.file", rl.prompts.file, kind="file")


def _name(rl) -> str:
    """How a rule names the algorithm: "NFT", "DPO" (an entry named by import string, as written)."""
    return rl.algorithm.upper() if ":" not in rl.algorithm else rl.algorithm


# ---------------------------------------------------------------------------------------- DPO
def data_parallel_grid(c: schema.RunConfig, r: Rules) -> None:
    """DPO and SFT: every rank trains its share of the step (data parallel, FSDP2)."""
    g, name = c.grid, _name(c.rl)
    if g.grouping == "per_role" and g.backend != "ray":
        r.error("grid.grouping", "per_role needs grid.backend = \"ray\" (under local there is one process)", g.grouping, 'set grid.grouping = "single" or grid.backend = "ray"')
    if g.gpu_placement != "colocated":
        r.error("grid.gpu_placement", f"{name} runs its roles colocated", g.gpu_placement, 'set grid.gpu_placement = "colocated"')
    for key in ("num_replicas", "ranks", "shapes", "gpus_per_role"):
        if getattr(g, key) is not None:
            r.error(f"grid.{key}", f"an NFT role-shape setting; {name}'s width is model.config.parallelism.data_parallel_shard_degree", getattr(g, key), f"remove grid.{key}")
    dp = c.model.config.parallelism.data_parallel_shard_degree
    # grid.nodes or grid.gpus_per_node below 1 is refused on its own key; their product here would
    # advise "set it to -1".
    if g.nodes >= 1 and g.gpus_per_node >= 1 and dp != g.nodes * g.gpus_per_node:
        r.error("model.config.parallelism.data_parallel_shard_degree", f"must equal grid.nodes * grid.gpus_per_node = {g.nodes} * {g.gpus_per_node}", dp,
                f"set it to {g.nodes * g.gpus_per_node} or change grid.nodes/grid.gpus_per_node")
    if g.backend == "local" and g.nodes > 1 and not (g.rdzv_endpoint or os.environ.get(RDZV_ENV)):
        r.error("grid.rdzv_endpoint", "multi-node torchrun needs the operator's rendezvous endpoint", "", f"set grid.rdzv_endpoint = \"host:port\" or export {RDZV_ENV}")


def dpo_rules(c: schema.RunConfig, rl: schema.DPOConfig, r: Rules) -> None:
    """DPO's rules (dpo.md): data-parallel grid, pairs per step, the data sources and explicit validation."""
    data_parallel_grid(c, r)
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
def sft_rules(c: schema.RunConfig, rl: schema.SFTConfig, r: Rules) -> None:
    """SFT's rules: data-parallel grid, samples per step, caption dropout, one image-caption source."""
    data_parallel_grid(c, r)
    if c.grid.grouping == "per_role" and c.grid.backend == "ray":
        r.error("grid.grouping", "SFT has no data role to place apart: every rank reads its own share of the samples", c.grid.grouping,
                'set grid.grouping = "single"')
    dp = c.model.config.parallelism.data_parallel_shard_degree
    r.at_least("rl.samples_per_step", rl.samples_per_step, 1)
    if rl.samples_per_step >= 1 and dp >= 1 and rl.samples_per_step % dp:
        r.error("rl.samples_per_step", f"must split evenly over the {dp} ranks", rl.samples_per_step, f"use a multiple of {dp}")
    if not 0 <= rl.caption_dropout < 1:
        r.error("rl.caption_dropout", "must be in [0, 1)", rl.caption_dropout, "use e.g. 0.1 (0 trains no unconditional prompt)")
    if not 0 <= rl.first_frame_condition <= 1:
        r.error("rl.first_frame_condition", "must be in [0, 1]", rl.first_frame_condition, "use e.g. 0.5 (half the clips train image-to-video)")
    elif rl.first_frame_condition > 0 and (c.model.num_frames == 1 or rl.train == "vae"):
        r.error("rl.first_frame_condition", "conditions a clip's first frame, and this run trains no clips through the transformer",
                rl.first_frame_condition, 'remove it, or train video (model.num_frames > 1) with rl.train = "transformer"')
    vae_stage_rules(c, rl, r)
    data = rl.data
    if not data.shards and not data.jsonl:
        r.error("rl.data", "no image-caption data source", "", "set rl.data.shards or rl.data.jsonl")
    elif data.shards and data.jsonl:
        r.error("rl.data", "more than one data source", ["jsonl", "shards"], "keep exactly one of rl.data.jsonl and rl.data.shards")
    if data.jsonl:
        r.local_path("rl.data.jsonl", data.jsonl, kind="file")
    for i, shard in enumerate(data.shards):
        r.shard_files(f"rl.data.shards[{i}]", shard)
