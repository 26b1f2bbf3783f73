"""What `plan` shows of an online run (NFT, GRPO): the five roles of one colocated process, the
rollout sampler, the rewards and which frames of a clip each scores, the per-step work.

The registry entries name these sections (config/algorithms.py); `plan.build` calls the one of the
run's algorithm. Pure, as plan.py.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.config import algorithms
from cosmos_rl.config.preflight.online import nft_shapes
from cosmos_rl.config.preflight.rewards import scores_clips
from cosmos_rl.core import schema
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.planning.media_cost import sample_costs
from cosmos_rl.planning.plan import (
    online_contents,
    ray_layout,
    sampler_shift,
    world_size,
)

# nft.md section 4's five roles of one colocated process per rank, and the code that plays each.
ONLINE_ROLES = {
    "data": "data.prompts.PromptCursor (every rank walks the same prompt rows)",
    "rollout": "trainers.online.OnlineTrainer.rollout (one sample per row, the old policy)",
    "reward": "trainers.online.OnlineTrainer._scores (own {media} to the reward services, then one all_gather)",
    "replay": "the step's own rollout batch, kept in memory until its training half (on-policy, no buffer)",
    "policy": "the algorithm's training half, then AdamW",
}


# rl.async_reward (one-step-off scoring, docs/nft.md): what differs from ONLINE_ROLES.
ASYNC_ROLES = {
    "reward": "trainers.online.OnlineTrainer._async_step (rl.async_reward: a thread sends step k+1's own {media} to the reward "
              "services as soon as rollout k+1 exists, while learn(k) and rollout k+2 run; step k+1 waits for them, then one all_gather)",
    "replay": "step k's rollout, made during step k-1's scoring by the policy before learn(k-1) (one policy version late), kept until "
              "its training half and in each checkpoint as pending_rollout",
}


GUIDANCE_SEMANTICS = "v = v_uncond + g * (v_cond - v_uncond): g = 1 is conditional only, g = 0 unconditional"


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


def online_section(config: schema.RunConfig, base_dir: Path) -> dict:
    """An online run: role shapes, the five roles of one process, the rollout sampler, the rewards."""
    rl = config.rl
    shapes, _ = nft_shapes(config)
    shift, shift_from = sampler_shift(config, base_dir)
    media = MediaSpec.from_model_config(config.model)
    return {
        "shapes": shapes,
        "roles_per_process": list(ONLINE_ROLES),
        "roles": {**{name: text.format(media="clips" if media.is_video else "images")  # what the rewards receive
                     for name, text in {**ONLINE_ROLES, **(ASYNC_ROLES if rl.async_reward else {})}.items()},
                  "policy": f"{algorithms.of(config).resolve_name('trainer')}.learn, then AdamW"},
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
        "reward": _reward_summary(rl, media),
        "ray": ray_layout(config, world_size(config)[0]),
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
