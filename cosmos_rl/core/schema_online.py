"""The online algorithms' `rl` tables (NFT, GRPO) and what they share: prompts, the old and
reference policies, reward services. Part of the manifest schema (`config/schema.py` re-exports
every class here, so `schema.NFTConfig` is the name the rest of the code uses); split out to keep
each schema module short.
"""

from __future__ import annotations

from typing import Literal, Optional

import attrs

from cosmos_rl.core import schema_common
from cosmos_rl.core.schema_common import FrameReduce, OptimizerConfig, RLBase, frozen, knob, required, section  # noqa: F401 (annotations)
# A reward table is shared with `[[rl.eval.rewards]]`, so it is declared in schema_common; re-exported here.
from cosmos_rl.core.schema_common import JUDGE_PROMPT, JUDGE_REGEX, JudgeConfig, RewardClientConfig, WeightedRewardConfig  # noqa: F401

# --------------------------------------------------------------------------------------------- NFT
@frozen
class PromptSourceConfig:
    file: str = knob("", "Prompt file: text (one per line) or JSONL (`{\"prompt\": ...}`); empty = built-in list.")
    shuffle: bool = knob(True, "Shuffle prompt order each pass (seeded from job.seed).")


@frozen
class OldPolicyConfig:
    build_old: bool = knob(True, "Keep a moving old policy (second adapter) for rollouts and v_old.")
    update_every: int = knob(1, "Refresh the old policy every this many steps (>= 1 when build_old).")
    decay_rate: float = knob(0.001, "Old-policy keep factor grows as min(decay_rate * (step - flat_steps), decay_cap) after rl.old.flat_steps.")
    flat_steps: int = knob(
        0, "Steps from the start during which the keep factor stays 0 (the old policy is the policy), before it grows: "
        "DiffusionNFT's flat-start schedule (its OCR recipe: flat_steps 75, decay_rate 0.0075, decay_cap 0.999); >= 0.")
    decay_cap: float = knob(0.5, "Upper bound of the keep factor: old = keep * old + (1 - keep) * policy.")


@frozen
class RefPolicyConfig:
    update_every: int = knob(0, "The reference is frozen; any non-zero value is rejected.")


@frozen
class RewardConfig(RewardClientConfig):
    name: str = knob("jpeg_compressibility", "Reward function the service computes.")


@frozen
class OnlineRLBase(RLBase):
    """The `rl` fields of an online algorithm (trainers/online.py): a group of samples per prompt
    row, one per model rank, scored by reward services; the rollout's sampler; the old policy."""

    init_from: str = knob("", "Base weights (required): `model.path` itself, a weights or DCP folder, `s3://` URL (pulled once per node) or `preset:tiny`.")
    group_size: int = knob(4, "Samples per prompt, and the model rank count (one sample per rank; x grid.context_parallel with context parallelism).")
    prompts_per_step: int = knob(1, "Prompt rows per step; every rank samples one image per row.")
    prompts: PromptSourceConfig = section(PromptSourceConfig, "Where prompts come from.")
    sample_steps: int = knob(20, "Sampler steps per generation.")
    sampler_shift: Optional[float] = knob(
        None, "Rectified-flow sampler shift; unset = the model's own (`flow_shift` in model.path's scheduler/scheduler_config.json, or the preset's)."
    )
    guidance: float = knob(3.0, "Native CFG: v_uncond + g * (v_cond - v_uncond); 1 = conditional only, 0 = unconditional.")
    rollout_seed_clock: Literal["source_row", "optimizer_step"] = knob(
        "source_row", "Rank-local rollout seeds advance per prompt row (`source_row`) or per optimizer step."
    )
    scheduler: str = knob("unipc", "Sampler; only `unipc` is supported.")
    sample_grid_every: int = knob(10, "Save a PNG grid of the step's samples every this many steps (clips: frame strips, and an animated GIF beside them); 0 = never.")
    old: OldPolicyConfig = section(OldPolicyConfig, "Moving old policy.")
    ref: RefPolicyConfig = section(RefPolicyConfig, "Frozen reference policy.")
    reward: RewardConfig = section(RewardConfig, "The HTTP reward service (one reward; for several use `[[rl.rewards]]` instead).")
    rewards: list[WeightedRewardConfig] = knob(
        attrs.Factory(list), "Several rewards at once, one `[[rl.rewards]]` table each; empty = the one `[rl.reward]`. Not both."
    )
    async_reward: bool = knob(
        False, "One-step-off scoring: step k+1's rollout is made while step k's samples are scored, and scored while step k trains, so a slow "
        "reward (a VLM judge) no longer stalls every step. Step k still trains on its own samples and advantages, but rollout k+1 is made before learn(k): every rollout after the "
        "first is one policy version late. NFT only; part of the seed contract; a checkpoint holds the pending rollout (docs/nft.md, "
        "\"One-step-off scoring\"). false = rollout, score, learn in series."
    )
    reward_combine: Literal["weighted_sum", "normalised_sum"] = knob(
        "weighted_sum", "With rl.rewards: advantages of the weighted sum of rewards, or the weighted sum of each reward's own advantages (normalised per group first, so no reward's scale drowns another)."
    )


@frozen
class NFTConfig(OnlineRLBase):
    algorithm: Literal["nft"] = required("`nft` selects online DiffusionNFT.")
    modality: Literal["image", "video"] = knob(
        "video", "Decoded media type; must agree with model.num_frames (`video` iff it is above 1). Video NFT takes no `rl.profile` and an empty `rl.init_keys_to_skip_loading` (docs/video.md)."
    )
    profile: str = knob("", "Known T2I profile (image only); sets the production coordinates.")
    init_keys_to_skip_loading: list[str] = knob(
        attrs.Factory(list), "Glob patterns of base-checkpoint keys the model does not build (`audio_*`, `action_*`); must be empty for video."
    )
    beta: float = knob(1.0, "Objective sharpness (implicit policies' step away from the old policy).")
    kl_beta: float = knob(1.0, "KL penalty weight against the frozen reference.")
    policy_loss_scale: float = knob(5.0, "Scale on the policy loss term.")
    advantage_low: float = knob(-5.0, "Lower advantage clamp.")
    advantage_high: float = knob(5.0, "Upper advantage clamp.")
    advantage_std_scope: Literal["batch", "group"] = knob(
        "batch", "Normalise advantages by the std of the whole gathered batch or of each prompt's group."
    )
    r_map: Literal["linear", "sigmoid"] = knob("linear", "Optimality map from advantage to r in [0, 1] (`linear`: see rl.linear_map; `sigmoid`: r = sigmoid(A / r_tau)).")
    linear_map: Literal["per_side", "span"] = knob(
        "per_side",
        "With r_map = `linear`, how the clamped advantage A becomes r: `per_side` (DiffusionNFT's map) sends A = 0 to 0.5 for any clamp, "
        "[advantage_low, 0] to [0, 0.5] and [0, advantage_high] to [0.5, 1] (needs advantage_low < 0 < advantage_high); `span` is "
        "r = (A - advantage_low) / (advantage_high - advantage_low), the map before this knob, which sends A = 0 to 0.5 only for a symmetric "
        "clamp (with -1 and 5 a group of equal rewards gets r = 1/6 and still moves the policy). The two agree exactly for a symmetric clamp; "
        "run directories written before this knob keep `span`.",
    )
    r_tau: float = knob(0.5, "Temperature of the sigmoid map.")
    uniform_timestep: bool = knob(False, "Train at t ~ U(0, 1) instead of the sampler's timesteps.")
    timesteps_per_sample: int = knob(
        0,
        "Training timesteps per sample, drawn at random per sample from the rollout's sampler timesteps "
        "(t ~ U(0, 1) with uniform_timestep); 0 = all but one, the one left out drawn at random.",
    )
    x0_weighting: bool = knob(
        True,
        "Measure the implicit policies' errors in x0 space (x0 = x_t - t * v), each divided by a stop-gradient of "
        "its mean absolute x0 error, as the official release does (the default); false = the velocity-space error of the spec.",
    )


# -------------------------------------------------------------------------------------------- GRPO
@frozen
class GRPOOldPolicyConfig(OldPolicyConfig):
    build_old: bool = knob(
        False, "GRPO keeps no moving old policy: the policy that sampled a step's rollouts is its old policy (their log-probs are recorded then); must stay false."
    )


@frozen
class GRPOConfig(OnlineRLBase):
    """Flow-GRPO (docs/grpo.md): the paper's defaults where this project's online base says nothing."""

    algorithm: Literal["grpo"] = required("`grpo` selects online Flow-GRPO (docs/grpo.md).")
    sample_steps: int = knob(10, "Sampler steps per rollout (Flow-GRPO trains at 10); every step but the last can be a Gaussian action with a log-prob.")
    scheduler: str = knob(
        "sde", "Rollout sampler's stochastic step, over the model's own sigmas: `sde`, Flow-GRPO's Euler-Maruyama SDE, or `cps`, the coefficients-preserving step "
        "(Flow-CPS: the sample keeps exactly its sigma's noise at any step size); held-out evaluation samples with UniPC either way."
    )
    old: GRPOOldPolicyConfig = section(GRPOOldPolicyConfig, "No moving old policy: the policy that sampled a step is its old policy (on-policy at one update a step, rl.updates_per_step).")
    noise_level: float = knob(
        0.7, "Noise level of the stochastic step: with `sde` Flow-GRPO's a, sigma_s = a * sqrt(s / (1 - s)) (the paper's 0.7), > 0; with `cps` its eta, "
        "the step's std s' * sin(eta * pi / 2) (Flow-CPS's configs: 0.8), in (0, 1]."
    )
    clip_range: float = knob(1e-4, "PPO clip range of the ratio of per-element-mean log-probs (Flow-GRPO's base config); > 0.")
    clip_range_high: Optional[float] = knob(
        None, "The upper clip bound's own range (asymmetric clip, DAPO's clip-higher): the ratio is clipped to [1 - clip_range, 1 + clip_range_high]; "
        "unset = rl.clip_range on both sides (Flow-GRPO); > 0."
    )
    kl_beta: float = knob(
        0.04, "Weight of the KL between the policy's and the frozen reference's SDE steps; 0 = no KL term (measured on logged steps only). With rl.kl_form = `exact` "
        "(the default) the number is not Flow-GRPO's: its reference code's KL leaves out the step size (divides by sigma_s^2, not the step's variance "
        "sigma_s^2 (s - s')), so 0.04 here pulls 1 / (s - s') times harder than its 0.04 (4-28x at 10 steps); rl.kl_form = `reference` takes its scaling."
    )
    kl_form: Literal["exact", "reference"] = knob(
        "exact", "The KL term's scaling: `exact`, the true KL of the two step Gaussians (the paper's formula), or `reference`, Flow-GRPO's reference code's, "
        "the exact KL times the step size (s - s') for the `sde` step (the same for `cps`, whose reference std is the step's own), so its configs' kl_beta means what it meant there."
    )
    timestep_fraction: float = knob(
        0.99, "Plain Flow-GRPO (sde_window = 0): the first floor(fraction * sample_steps) sampler steps train, between 1 and sample_steps - 1 of them."
    )
    sde_window: int = knob(
        0, "0 = plain Flow-GRPO (SDE on every step but the last); k > 0 = Flow-GRPO-Fast: SDE on k consecutive steps at a start drawn each step, the ODE elsewhere, only those k train."
    )
    sde_window_range: list[int] = knob(
        attrs.Factory(list), "Flow-GRPO-Fast: [lo, hi], the steps the window may cover (its start drawn uniformly from lo to hi - sde_window); empty = every step but the last."
    )
    advantage_std_scope: Literal["group", "batch"] = knob(
        "group", "Normalise each reward by its prompt group's std (the paper) or by one std over the step's batch (Flow-GRPO's SD3 configs)."
    )
    advantage_clip: float = knob(5.0, "Clamp advantages to [-advantage_clip, advantage_clip] (Flow-GRPO's adv_clip_max); > 0.")
    ema_decay: float = knob(
        0.0, "Keep an exponential moving average of the policy adapter, ema = decay * ema + (1 - decay) * policy every rl.ema_every steps, and make it the run's model: "
        "`[rl.eval]`, `cosmos-rl eval`, `export` and `pairs mine` use it, rollouts and training the policy (Flow-GRPO's reference code: 0.9); 0 = none, in [0, 1)."
    )
    ema_every: int = knob(8, "Steps between updates of the moving average (rl.ema_decay > 0; Flow-GRPO's reference code: 8); >= 1.")
    ema_warmup: bool = knob(
        False, "Warm the moving average up as Flow-GRPO's EMA wrapper does: each update's decay is min((1 + t) / (10 + t), rl.ema_decay), "
        "t the optimizer steps taken so far, so early averages follow the policy; false = rl.ema_decay from the first update."
    )
    updates_per_step: int = knob(
        1, "Optimizer steps a run step takes: each rank's samples split into this many equal slices by prompt, one update per slice, each later slice's ratio off-policy "
        "and clipped (Flow-GRPO's reference code: 2 a sampling round); divides rl.prompts_per_step, >= 1."
    )
    same_initial_noise: bool = knob(
        False, "Start every sample of a prompt's group from one initial noise (Flow-GRPO's same-latent option), so the group's rewards differ only through its SDE steps; "
        "false = each rank's own noise, as NFT."
    )


# Resolve the string annotations once so that tools walking the tree (docs, did-you-mean) see types.
for _cls in list(globals().values()):
    if isinstance(_cls, type) and attrs.has(_cls) and _cls.__module__ == __name__:
        attrs.resolve_types(_cls, {**vars(schema_common), **globals()})  # inherited fields name schema_common's tables
