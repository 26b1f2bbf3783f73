"""Config -> the resolved run: topology, per-step work, sampler, reward, checkpoints, identity, launch.

Pure: no I/O beyond reading the config, no heavy imports. ``cli`` renders it with rich or as JSON,
and the trainers take their launch argv and identity from here so that what `plan` prints is what
`train` does.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from cosmos_rl.config import algorithms, legacy_keys, load
from cosmos_rl.config.preflight.grid import RDZV_ENV
from cosmos_rl.core import schema
from cosmos_rl.core.paths import resolve_path
from cosmos_rl.models import layout, towers
from cosmos_rl.planning.media_cost import context_parallel_section, media_section, memory_section


def run_dir(config: schema.RunConfig) -> Path:
    return Path(config.job.output_dir) / config.job.name


def world_size(config: schema.RunConfig) -> tuple[int, str]:
    """(ranks, how the manifest fixes them): the algorithm's rule (registry entry `world_size`)."""
    return algorithms.of(config).world_size(config)


def _at_later_default(key: str, value) -> bool:
    """Whether dotted `key` is a knob added later (schema.LATER_KNOB_DEFAULTS) at the value that
    reproduces what runs did before it existed."""
    key = re.sub(r"\[\d+\]", "[]", key)  # an array of tables' entries share one key
    later = schema.LATER_KNOB_DEFAULTS
    return key in later and value == later[key]


def seed_contract(config: schema.RunConfig) -> dict:
    """What fixes every random draw of a run; exact resume refuses any change to it."""
    contract = {"job.seed": config.job.seed, "world_size": world_size(config)[0]}
    # A key added later is left out at the value that reproduces older runs, so their saved
    # contracts and identities still match.
    contract.update({k: v for k, v in algorithms.seed_values(algorithms.of(config), config.rl).items()
                     if not _at_later_default(k, v)})
    return contract


def identity_fields(config: schema.RunConfig) -> dict:
    flat = load.flatten(load.to_dict(config))
    # A condition the replaced keys could say is hashed as they said it: older run dirs resume.
    flat = legacy_keys.identity_spelling(flat, config.rl.algorithm)
    return {k: v for k, v in sorted(flat.items())
            if not schema.non_identity(k) and not _at_later_default(k, v) and not _computes_as_before(k, flat)}


def _computes_as_before(key: str, flat: dict) -> bool:
    """Whether a later knob away from its LATER_KNOB_DEFAULTS value still computes what that value
    did for this config, so that it stays out of the identity and older run dirs of it resume:
    NFT's `per_side` optimality map equals `span` for a symmetric clamp (every shipped manifest's
    -5, 5) and is unused by the sigmoid map."""
    if key != "rl.linear_map":
        return False
    return flat.get("rl.r_map") != "linear" or flat.get("rl.advantage_low") == -flat.get("rl.advantage_high", 0.0)


def run_identity(config: schema.RunConfig) -> str:
    """Hash of everything that changes what the run computes (reward revision and seed contract included)."""
    payload = json.dumps({"fields": identity_fields(config), "seed_contract": seed_contract(config)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _weights(config: schema.RunConfig) -> str:
    return "policy LoRA adapter" if config.model.lora.rank > 0 else "policy weights (full fine-tune)"


def text_tower_reuse(config: schema.RunConfig) -> str:
    """Whether training forwards reuse the text tower's keys/values (models/text_kv.py), and why."""
    if config.model.lora.rank == 0:
        return "off in training forwards: a full fine-tune trains the text tower (rollouts still reuse within a step)"
    named = list(config.model.lora.target_modules)
    hits = towers.adapts_text_tower(named or list(towers.DEFAULT_TARGET_MODULES))
    if hits:
        which = "model.lora.target_modules" if named else "the default model.lora.target_modules"
        return (
            f"off in training forwards: {which} adapt the text tower ({', '.join(hits)}); sampling loops "
            "(rollouts, evaluation) still reuse within each loop; [\"generation\"] would turn it on"
        )
    return "on: no adapter on the text tower, its keys and values are computed once per prompt per step"


def checkpoint_contents(config: schema.RunConfig) -> list[str]:
    contents = algorithms.of(config).resolve("checkpoint_contents")
    return contents(config) if contents is not None else [_weights(config), "optimizer", "step", "RNG streams"]


def online_contents(config: schema.RunConfig) -> list[str]:
    old = ["old-policy adapter" if config.model.lora.rank > 0 else "old-policy weights"] if config.rl.old.build_old else []
    return [_weights(config), *old, "optimizer", "step", "prompt cursor", "seed contract", "RNG streams"]


def sft_contents(config: schema.RunConfig) -> list[str]:
    trained = "VAE weights" if config.rl.train == "vae" else _weights(config)
    return [trained, "optimizer", "step", "sample cursor", "RNG streams"]


def dpo_contents(config: schema.RunConfig) -> list[str]:
    cursor = "pair cursor" if config.rl.data.cursor_resume else "step (pair cursor not resumed)"
    return [_weights(config), "optimizer", "step", cursor, "RNG streams"]


def torchrun_argv(config: schema.RunConfig, manifest_in_run_dir: str) -> list[str]:
    """The torchrun command line for a DPO or SFT run (run as-is on every node)."""
    g = config.grid
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={g.nodes}", f"--nproc-per-node={g.gpus_per_node}"]
    if g.nodes == 1:
        argv += ["--standalone", "--local-addr=127.0.0.1"]
    else:
        import os

        # preflight guarantees one of the two; the value is printed so the command runs as shown
        endpoint = g.rdzv_endpoint or os.environ.get(RDZV_ENV, "")
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={config.job.name}"]
    return argv + ["-m", "cosmos_rl.trainers.spmd_worker", manifest_in_run_dir]


def launch_argv(config: schema.RunConfig, manifest_path: str, overrides: list[str]) -> list[str]:
    manifest_in_run_dir = str(run_dir(config) / "manifest.toml")
    if config.grid.backend == "local":
        return torchrun_argv(config, manifest_in_run_dir)
    # Ray: this process is the driver; it starts (or joins) the cluster and the actor group itself.
    return ["cosmos-rl", "train", manifest_path, *overrides]


def build(config: schema.RunConfig, manifest_path: str = "MANIFEST", overrides: list[str] = (), memory: bool = True) -> dict:
    """What `plan` prints (and `validate` summarises). `memory = False` leaves out the memory per rank,
    whose VAE term imports torch and diffusers: `validate` stays free of the model stack."""
    rl = config.rl
    size, derivation = world_size(config)
    out: dict = {
        "algorithm": rl.algorithm,
        "backend": config.grid.backend,
        "grouping": config.grid.grouping,
        "gpu_placement": config.grid.gpu_placement,
        "world_size": size,
        "world_size_from": derivation,
        "nodes": config.grid.nodes,
        "device": config.grid.device,
        "dtype": config.model.dtype,
        "model": config.model.path or f"built-in preset {config.model.preset!r}",
        "base": base_summary(config, _base_dir(manifest_path)),
        "fine_tune": f"LoRA rank {config.model.lora.rank}" if config.model.lora.rank else "full",
        "text_tower_reuse": text_tower_reuse(config),
        "run_dir": str(run_dir(config)),
        "max_steps": rl.max_steps,
        "checkpoint": {"every": config.checkpoint.every, "keep": config.checkpoint.keep, "contents": checkpoint_contents(config)},
        # The run records the identity of its manifest with every path made absolute (run_dir.pin_paths
        # writes that manifest.toml), so a relative rl.prompts.file would otherwise hash differently here.
        "identity": run_identity(load.with_absolute_paths(config, _base_dir(manifest_path))),
        "seed_contract": seed_contract(config),
        "launch": launch_argv(config, manifest_path, list(overrides)),
    }
    out["eval"] = _eval_summary(config)
    out["media"] = media_section(config, _base_dir(manifest_path))
    out["context_parallel"] = context_parallel_section(config, _base_dir(manifest_path))
    estimate = memory_section(config, _base_dir(manifest_path), size) if memory else None
    if estimate is not None:
        out["memory"] = estimate
    section = algorithms.of(config).resolve("plan_section")
    if section is not None:
        out.update(section(config, _base_dir(manifest_path)))
    return out


def _base_dir(manifest_path: str) -> Path:
    return Path(manifest_path).resolve().parent


def base_summary(config: schema.RunConfig, base_dir: Path) -> dict:
    """Where the transformer's weights come from, as the run will resolve them."""
    rl, model = config.rl, config.model
    value = rl.init_from
    out = {"init_from": value, "kind": "", "resolved": "", "skip_patterns": list(rl.init_keys_to_skip_loading)}
    if value == "" and model.path:
        folder = resolve_path(model.path, base_dir)
        out.update(kind="model.path", resolved=f"model.path's own weights, {Path(folder) / 'transformer'}")
    elif value == "" or value.startswith(layout.PRESET_SCHEME):
        name = value[len(layout.PRESET_SCHEME):] or model.preset
        if name in layout.SHIPPED_PRESETS:
            out.update(kind="preset", resolved=f"the shipped pretrained weights of preset {name!r} (cosmos_rl/models/presets/{name})")
        else:
            out.update(kind="preset", resolved=f"random weights of preset {name!r} seeded by job.seed = {config.job.seed}")
    elif value.startswith(layout.S3_SCHEME):
        cache = layout.s3_cache_dir(value, layout.init_cache_root(config.job.output_dir))
        state = "already pulled" if cache.is_dir() else "pulled once per node at start"
        out.update(kind="s3", resolved=f"{value} -> {cache} ({state})", cache_dir=str(cache))
    else:
        folder = Path(resolve_path(value, base_dir))
        found = layout.base_format(folder)
        if layout.is_pipeline_folder(folder):
            out.update(kind="diffusers folder", resolved=f"{folder}: weights from transformer/ (the folder is model.path)")
        elif found and found[0] == "dcp":
            out.update(kind="dcp", resolved=f"DCP checkpoint {folder}")
        elif found:
            out.update(kind="safetensors", resolved=f"safetensors weights in {found[1]}")
        else:
            out.update(kind="unknown", resolved=f"{folder} (no weights found: the run will refuse it)")
    return out


def sampler_shift(config: schema.RunConfig, base_dir: Path) -> tuple[float | None, str]:
    """(flow shift the sampler runs at, what set it): the manifest's value, else the model's own."""
    if config.rl.sampler_shift is not None:
        return config.rl.sampler_shift, "rl.sampler_shift"
    if config.model.path:
        folder = Path(resolve_path(config.model.path, base_dir))
        try:
            return layout.folder_flow_shift(folder), str(folder / layout.SCHEDULER_CONFIG)
        except ValueError as exc:  # preflight reports it; plan still shows what it could not read
            return None, str(exc)
    if config.model.preset not in layout.PRESET_FLOW_SHIFT:  # no model named yet: preflight says which key
        return None, "no model yet (model.path or model.preset)"
    return layout.PRESET_FLOW_SHIFT[config.model.preset], f"preset {config.model.preset!r} scheduler"


def ray_layout(config: schema.RunConfig, actors: int) -> dict:
    """What the Ray backend will ask the cluster for (ray_group.ActorGroup reserves exactly this)."""
    g = config.grid
    if g.device == "cuda":
        bundle = {"GPU": 1, "CPU": g.cpus_per_rank or 1}
    else:
        bundle = {"CPU": g.cpus_per_rank or "cluster CPUs / ranks"}
    return {
        "address": g.ray_address or "RAY_ADDRESS if set, else a local cluster",
        "actors": actors,
        "bundle_per_rank": bundle,
        # One bundle per rank, SPREAD over grid.nodes when > 1 (else PACK): for DPO, preflight makes
        # this grid.gpus_per_node on every node; NFT's group_size (x grid.context_parallel) actors are dealt out as evenly.
        "bundles_per_node": [actors // g.nodes + (n < actors % g.nodes) for n in range(g.nodes)],
        "placement_strategy": "SPREAD" if g.nodes > 1 else "PACK",
    }


def _eval_summary(config: schema.RunConfig) -> dict | str:
    """[rl.eval]: what is evaluated during training (cosmos_rl.evaluation), or "off"."""
    from cosmos_rl.config.sampler import run_settings

    e = config.rl.eval
    if e.every <= 0:
        return "off"
    prompts = e.prompts or ("shapes held-out prompts, all" if e.per_task <= 0 else f"shapes held-out prompts, up to {e.per_task} per task")
    sampler = run_settings(config)
    # An algorithm with no training signal (SFT trains on no reward) has nothing to compare, so its window means nothing.
    watch = e.hacking_window if algorithms.of(config).train_signal else "none (no training reward)"
    out = {"every": e.every, "prompts": prompts, "seeds": e.seeds, "reward": e.reward, "hacking_window": watch,
           "sampler": f"{sampler.steps} steps, guidance {sampler.guidance:g}"}  # fmt: skip
    # The watch's options, shown only when set (a plan without them reads as before).
    if e.gold:
        out["gold"] = e.gold
    if e.stop_on_hacking:
        out["stop_on_hacking"] = "commit and exit 3 at the first warning"
    return out


