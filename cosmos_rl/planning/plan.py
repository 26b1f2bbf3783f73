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
from cosmos_rl.config.preflight.online import nft_shapes
from cosmos_rl.core import schema
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.core.paths import resolve_path
from cosmos_rl.config.preflight.rewards import scores_clips
from cosmos_rl.models import layout, towers
from cosmos_rl.planning.media_cost import context_parallel_section, media_section, memory_section, sample_costs

# nft.md section 4's five roles of one colocated process per rank, and the code that plays each.
ONLINE_ROLES = {
    "data": "data.prompts.PromptCursor (every rank walks the same prompt rows)",
    "rollout": "trainers.online.OnlineTrainer.rollout (one sample per row, the old policy)",
    "reward": "trainers.online.OnlineTrainer._scores (own images to the reward services, then one all_gather)",
    "replay": "the step's own rollout batch, kept in memory until its training half (on-policy, no buffer)",
    "policy": "the algorithm's training half, then AdamW",
}
# rl.async_reward (one-step-off scoring, docs/nft.md): what differs from ONLINE_ROLES.
ASYNC_ROLES = {
    "reward": "trainers.online.OnlineTrainer._async_step (rl.async_reward: a thread sends step k+1's own images to the reward "
              "services as soon as rollout k+1 exists, while learn(k) and rollout k+2 run; step k+1 waits for them, then one all_gather)",
    "replay": "step k's rollout, made during step k-1's scoring by the policy before learn(k-1) (one policy version late), kept until "
              "its training half and in each checkpoint as pending_rollout",
}
GUIDANCE_SEMANTICS = "v = v_uncond + g * (v_cond - v_uncond): g = 1 is conditional only, g = 0 unconditional"


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


def _frames_scored(t, frames: int) -> str:
    """How a video run's reward `t` scores a clip of `frames` frames (docs/rewards.md, "Video")."""
    if not t.url and scores_clips(t.name):
        return "whole clips (a clip reward)"
    if t.judge.model:
        from cosmos_rl.rewards.vlm_judge import sampled_frames

        return f"frames {', '.join(map(str, sampled_frames(frames, t.judge.frames)))} of each clip, in one judge message"
    picked = {"first": [0], "last": [frames - 1]}.get(t.frame_reduce, list(range(0, frames, t.frame_stride)))
    how = f"frames {', '.join(map(str, picked))} of each clip, their {t.frame_reduce}" if len(picked) > 1 else f"frame {picked[0]} of each clip alone"
    return how + ("" if not t.url else " (if the service scores images; a clip reward gets whole clips)")


def _endpoint(t, builtin: str) -> str:
    """Where a reward is scored: a VLM judge's model and server, a service's url, or the built-in service."""
    if t.judge.model:
        return f"VLM judge {t.judge.model} at {t.url}"
    return t.url or builtin


def _reward_summary(rl: schema.OnlineRLBase, media: MediaSpec) -> dict:
    """The rewards of an online run (NFT, GRPO) that makes `media`; for clips, which frames each scores."""
    builtin = "built-in service, started on a free 127.0.0.1 port"
    frames = media.frames
    if not rl.rewards:
        out = {"endpoint": _endpoint(rl.reward, builtin), "name": rl.reward.name, "revision": rl.reward.revision}
        return {**out, "frames": _frames_scored(rl.reward, frames)} if media.is_video else out
    return {
        "endpoint": ", ".join(_endpoint(r, builtin) for r in rl.rewards),
        "name": " + ".join(f"{r.weight:g} x {r.name}" for r in rl.rewards) + f" ({rl.reward_combine})",
        "revision": ", ".join(r.revision for r in rl.rewards),
        "terms": [{"name": r.name, "weight": r.weight, "endpoint": _endpoint(r, builtin), "revision": r.revision,
                   "reward_revision": r.reward_revision, "model": r.model,
                   **({"frames": _frames_scored(r, frames)} if media.is_video else {})} for r in rl.rewards],
    }  # fmt: skip


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


def online_section(config: schema.RunConfig, base_dir: Path) -> dict:
    """An online run: role shapes, the five roles of one process, the rollout sampler, the rewards."""
    rl = config.rl
    shapes, _ = nft_shapes(config)
    shift, shift_from = sampler_shift(config, base_dir)
    return {
        "shapes": shapes,
        "roles_per_process": list(ONLINE_ROLES),
        # The roles' texts say "images"; a clip run's rewards score clips.
        "roles": {name: text.replace("own images", "own clips") if MediaSpec.from_model_config(config.model).is_video else text
                  for name, text in {**ONLINE_ROLES, "policy": f"{algorithms.of(config).resolve_name('trainer')}.learn, then AdamW",
                                     **(ASYNC_ROLES if rl.async_reward else {})}.items()},
        "per_step": {
            "prompt_rows": rl.prompts_per_step,
            "samples": rl.prompts_per_step * rl.group_size,
            "samples_per_rank": rl.prompts_per_step,
            # grid.context_parallel = N: each sample's work is shared by a context group of N ranks,
            # so "per rank" is per data-parallel rank (one group); the rewards score each sample once.
            **({"data_parallel_ranks": rl.group_size, "ranks_per_sample": config.grid.context_parallel}
               if config.grid.context_parallel > 1 else {}),
        },
        "sampler": {
            "scheduler": rl.scheduler,
            "steps": rl.sample_steps,
            "shift": shift,
            "shift_from": shift_from,
            "guidance": rl.guidance,
            "guidance_semantics": GUIDANCE_SEMANTICS,
            "seed_clock": rl.rollout_seed_clock,
        },
        "reward": _reward_summary(rl, MediaSpec.from_model_config(config.model)),
        "ray": _ray_layout(config, world_size(config)[0]),
    }


def nft_section(config: schema.RunConfig, base_dir: Path) -> dict:
    out = online_section(config, base_dir)
    rl = config.rl
    per_sample = rl.timesteps_per_sample or rl.sample_steps - 1
    out["per_step"]["train_timesteps_per_sample"] = per_sample
    # The training forward packs every row of a rank at each of its timesteps into one forward with
    # grad (v_old and v_ref run without), so its activations are rows x K samples' (docs/video.md).
    costs = sample_costs(config, base_dir)
    if costs is not None:
        # grid.context_parallel = N: each rank of a context group holds 1/N of them.
        out["per_step"]["train_activation_mib_per_rank"] = round(costs[2] * rl.prompts_per_step * per_sample / max(config.grid.context_parallel, 1) / 2**20, 2)
    return out


def grpo_section(config: schema.RunConfig, base_dir: Path) -> dict:
    """GRPO: the online section, with its SDE rollout sampler and the steps that train."""
    from cosmos_rl.config.preflight.grpo import trained_step_count, window_range

    out = online_section(config, base_dir)
    rl = config.rl
    out["roles"]["rollout"] = (
        f"{algorithms.of(config).resolve_name('trainer')}.sample (the SDE sampler with the policy itself, each SDE step's log-prob recorded)"
    )
    if rl.sde_window:
        lo, hi = window_range(rl)
        variant = f"Flow-GRPO-Fast: SDE on {rl.sde_window} consecutive step(s), start drawn each step from {lo}..{hi - rl.sde_window}, ODE elsewhere"
        trained = rl.sde_window
    else:
        variant = f"Flow-GRPO: SDE on every step but the last, the first floor({rl.timestep_fraction:g} x {rl.sample_steps}) train"
        trained = trained_step_count(rl.timestep_fraction, rl.sample_steps)
    out["sampler"].update(
        noise_level=rl.noise_level, variant=variant,
        evaluation="held-out evaluation samples with UniPC (the model's own scheduler), as every algorithm's",
    )  # fmt: skip
    out["per_step"]["trained_steps_per_sample"] = trained
    out["objective"] = {"clip_range": rl.clip_range if rl.clip_range_high is None else [rl.clip_range, rl.clip_range_high], "kl_beta": rl.kl_beta,
                        "kl": ("exact KL of the policy's and the reference's SDE steps" if rl.kl_form == "exact"
                               else "Flow-GRPO's reference-code KL: the exact KL times the step size")}
    out["per_step"]["optimizer_steps"] = rl.updates_per_step
    if rl.updates_per_step > 1:
        out["per_step"]["prompts_per_update"] = rl.prompts_per_step // rl.updates_per_step
    if rl.ema_decay:
        out["moving_average"] = (f"ema = {rl.ema_decay:g} x ema + {1 - rl.ema_decay:g} x policy every {rl.ema_every} steps: "
                                 "the run's model, what [rl.eval], eval, export and pairs mine use"
                                 + ("; warmed up: decay min((1 + t) / (10 + t), that), t = optimizer steps" if rl.ema_warmup else ""))
    return out


def grpo_contents(config: schema.RunConfig) -> list[str]:
    contents = online_contents(config)
    if config.rl.ema_decay:
        contents.insert(1, "moving-average adapter (the run's model)")
    return contents


def sft_section(config: schema.RunConfig, base_dir: Path) -> dict:
    rl, size = config.rl, world_size(config)[0]
    out = {
        "roles_per_process": ["data", "policy"],
        "per_step": _per_step("samples", rl.samples_per_step, config, size),
        "data": f"{_shard_count(rl.data.shards)} webdataset shard(s)" if rl.data.shards else f"JSONL {rl.data.jsonl}",
        "trains": "the VAE (autoencoder)" if rl.train == "vae" else "the transformer (flow matching)",
    }
    if config.grid.backend == "ray":
        out["ray"] = _ray_layout(config, size)
    return out


def dpo_section(config: schema.RunConfig, base_dir: Path) -> dict:
    rl, ranks = config.rl, world_size(config)[0]
    out = {
        "roles_per_process": ["policy (+ data in its own actor)"] if config.grid.grouping == "per_role" else ["data", "policy"],
        "per_step": _dpo_per_step(config, ranks),
        "data": _data_summary(rl.data),
        "validation": (
            {"every": rl.validation.every, "max_pairs": rl.validation.max_pairs, "data": _data_summary(rl.validation.data)}
            if rl.validation.every
            else "off"
        ),
        "beta": rl.beta,
    }
    costs = sample_costs(config, base_dir) if config.model.num_frames > 1 else None
    if costs is not None:
        # The policy's forward with grad packs every winner and loser of the rank (the reference's runs
        # without), so its kept activations are 2 x pairs_per_rank clips' (docs/video.md "DPO on clips").
        # With context parallelism a data-parallel share's clips are split over its cp ranks.
        pairs = out["per_step"]["pairs_per_rank"] / max(config.grid.context_parallel, 1)
        out["per_step"]["train_activation_mib_per_rank"] = round(costs[2] * 2 * pairs / 2**20, 2)
    if config.grid.backend == "ray":
        out["ray"] = _ray_layout(config, ranks)
    return out


def _dpo_per_step(config: schema.RunConfig, ranks: int) -> dict:
    return _per_step("pairs", config.rl.pairs_per_step, config, ranks)


def _per_step(unit: str, count: int, config: schema.RunConfig, ranks: int) -> dict:
    """DPO's pairs (SFT's samples) per step and per data-parallel rank: with grid.context_parallel
    = N a context group of N ranks trains one share (`<unit>_per_rank` is then per group)."""
    cp = max(config.grid.context_parallel, 1)
    if cp > 1 and ranks >= cp and ranks % cp == 0:
        return {unit: count, f"{unit}_per_rank": count // (ranks // cp), "data_parallel_ranks": ranks // cp, "ranks_per_sample": cp}
    return {unit: count, f"{unit}_per_rank": count // max(ranks, 1)}


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


def _ray_layout(config: schema.RunConfig, actors: int) -> dict:
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


def _shard_count(entries: list[str]) -> int:
    """Shard files the entries name as the reader expands them: brace patterns ("a-{0..2}.tar" is
    three) and "::"-joined lists."""
    from cosmos_rl.data.tar_index import shard_names

    return len(shard_names(entries))


def _data_summary(data: schema.PreferenceDataConfig) -> str:
    if data.synthetic_pairs:
        return f"{data.synthetic_pairs} synthetic pairs (seed offset {data.synthetic_seed})"
    if data.jsonl:
        return f"JSONL {data.jsonl}"
    if data.shards:
        return f"{_shard_count(data.shards)} webdataset shard(s)"
    if data.factory:
        return f"factory {data.factory}"
    return "none"
