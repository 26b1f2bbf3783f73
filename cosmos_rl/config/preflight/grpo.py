"""Flow-GRPO's rules (docs/grpo.md, "How a run works"): the online topology and reward rules
(`online.online_rules`), then its sampler, its old policy and its objective's knobs. The registry
names `grpo_rules` (config/algorithms.py).

Torch-free like every preflight module, so the step counts are worked out here by the same rule
as `algorithms.grpo_sampler.train_steps` (tests/test_grpo_trainer.py checks the two agree).
"""

from __future__ import annotations

import math

import attrs

from cosmos_rl.core import schema
from cosmos_rl.config.preflight.online import batch_std_rule, online_rules
from cosmos_rl.config.preflight.rules import Rules

# The rollout step dynamics (algorithms.grpo.STEP_DYNAMICS's keys; tests check the two agree).
GRPO_SCHEDULERS = ("sde", "cps")

# grpo_sampler's slack: floor(0.29 * 100) must be 29, not 28.999999999999996's 28.
_FRACTION_SLACK = 1e-9


def trained_step_count(timestep_fraction: float, sample_steps: int) -> int:
    """Plain Flow-GRPO's trained steps per sample, floor(fraction * steps) (valid: 1 to steps - 1)."""
    return math.floor(timestep_fraction * sample_steps + _FRACTION_SLACK)


def window_range(rl: schema.GRPOConfig) -> tuple[int, int]:
    """The steps Flow-GRPO-Fast's window may cover, (lo, hi): rl.sde_window_range, else all but the last."""
    return tuple(rl.sde_window_range) if rl.sde_window_range else (0, rl.sample_steps - 1)


def grpo_rules(c: schema.RunConfig, rl: schema.GRPOConfig, r: Rules) -> None:
    online_rules(c, rl, r)
    if rl.scheduler not in GRPO_SCHEDULERS:
        r.error("rl.scheduler", "GRPO rolls out with a stochastic sampler, whose steps have log-probs", rl.scheduler,
                'set rl.scheduler = "sde" (Flow-GRPO) or "cps" (coefficients-preserving); held-out evaluation samples with UniPC either way')
    elif rl.scheduler == "cps" and not rl.noise_level <= 1:
        r.error("rl.noise_level", "is the CPS step's eta, whose std s' * sin(eta * pi / 2) needs eta in (0, 1]", rl.noise_level,
                "use e.g. 0.8 (Flow-CPS's configs), or rl.scheduler = \"sde\" for Flow-GRPO's a")
    if rl.old.build_old:
        r.error("rl.old.build_old", "GRPO keeps no moving old policy: the policy that sampled a step's rollouts is its old policy", True,
                "set rl.old.build_old = false")
    r.positive("rl.noise_level", rl.noise_level)
    r.positive("rl.clip_range", rl.clip_range)
    if rl.clip_range_high is not None:
        r.positive("rl.clip_range_high", rl.clip_range_high)
    r.at_least("rl.kl_beta", rl.kl_beta, 0)
    r.positive("rl.advantage_clip", rl.advantage_clip)
    batch_std_rule(rl, r)
    _ema_rules(c, rl, r)
    _update_rules(rl, r)
    r.at_least("rl.sde_window", rl.sde_window, 0, "set rl.sde_window to 0 (plain Flow-GRPO) or a window of 1 or 2 steps (Flow-GRPO-Fast)")
    steps = rl.sample_steps
    if steps < 2 or rl.sde_window < 0:
        return  # reported above; the step rules below need a sampler with an SDE-capable step
    default_fraction = attrs.fields(schema.GRPOConfig).timestep_fraction.default
    if rl.sde_window == 0:
        _fraction_rule(rl.timestep_fraction, steps, r)
        if rl.scheduler == "cps":
            r.warn("rl.scheduler", "CPS on every step but the last narrows the samples: each CPS step re-noises the model's estimate of "
                   "the clean image, whose spread is below the data's (docs/grpo_math.md, \"The CPS step\")", rl.scheduler,
                   "set rl.sde_window (Flow-CPS's configs: 3, in [0, sample_steps / 2]), or rl.scheduler = \"sde\"")
        if rl.sde_window_range:
            r.warn("rl.sde_window_range", "has no effect with plain Flow-GRPO (rl.sde_window = 0)", rl.sde_window_range,
                   "remove it, or set rl.sde_window to the window size")
        return
    if rl.timestep_fraction != default_fraction:
        r.warn("rl.timestep_fraction", "has no effect with Flow-GRPO-Fast (rl.sde_window > 0): the window's steps are the ones that train",
               rl.timestep_fraction, "remove it")
    if rl.sde_window > steps - 1:
        r.error("rl.sde_window", f"is longer than the {steps - 1} steps of rl.sample_steps = {steps} that can be SDE steps (the last is an ODE step)",
                rl.sde_window, f"use 1 or 2 (Flow-GRPO-Fast), at most {steps - 1}")
        return
    given = rl.sde_window_range
    if given and not (len(given) == 2 and 0 <= given[0] < given[1] <= steps - 1 and given[1] - given[0] >= rl.sde_window):
        r.error("rl.sde_window_range", f"must be [lo, hi] with 0 <= lo < hi <= {steps - 1} and room for rl.sde_window = {rl.sde_window} steps",
                given, f"use e.g. [0, {steps // 2}] (the early, high-noise half), or remove it for every step but the last")


def _ema_rules(c: schema.RunConfig, rl: schema.GRPOConfig, r: Rules) -> None:
    if not 0 <= rl.ema_decay < 1:  # also refuses nan
        r.error("rl.ema_decay", "must be in [0, 1)", rl.ema_decay, "use 0.9 (Flow-GRPO's reference code), or 0 for no moving average")
    r.at_least("rl.ema_every", rl.ema_every, 1, "use e.g. 8 (Flow-GRPO's reference code)")
    if rl.ema_decay > 0 and c.model.lora.rank == 0:
        r.error("rl.ema_decay", "the moving average is a second LoRA adapter, and model.lora.rank = 0 trains every weight", rl.ema_decay,
                "set rl.ema_decay = 0, or train a LoRA adapter (model.lora.rank > 0)")
    elif rl.ema_decay == 0 and rl.ema_every != attrs.fields(schema.GRPOConfig).ema_every.default:
        r.warn("rl.ema_every", "has no effect without a moving average (rl.ema_decay = 0)", rl.ema_every,
               "remove it, or set rl.ema_decay (e.g. 0.9)")
    if rl.ema_decay == 0 and rl.ema_warmup:
        r.warn("rl.ema_warmup", "has no effect without a moving average (rl.ema_decay = 0)", rl.ema_warmup,
               "remove it, or set rl.ema_decay (e.g. 0.9)")


def _update_rules(rl: schema.GRPOConfig, r: Rules) -> None:
    r.at_least("rl.updates_per_step", rl.updates_per_step, 1, "use 1 (on-policy) or 2 (Flow-GRPO's reference code)")
    if rl.updates_per_step >= 1 and rl.prompts_per_step >= 1 and rl.prompts_per_step % rl.updates_per_step:
        r.error("rl.updates_per_step", f"must divide rl.prompts_per_step = {rl.prompts_per_step}: each update trains an equal slice of the step's prompts",
                rl.updates_per_step, f"use a divisor of {rl.prompts_per_step}, e.g. 1 or 2")


def _fraction_rule(fraction: float, steps: int, r: Rules) -> None:
    if not 0 < fraction <= 1:  # also refuses nan and inf, which floor() cannot take
        r.error("rl.timestep_fraction", "must be in (0, 1]", fraction, "use e.g. 0.99 (every step but the last trains)")
        return
    count = trained_step_count(fraction, steps)
    if not 1 <= count <= steps - 1:
        r.error("rl.timestep_fraction", f"trains floor({fraction:g} x {steps}) = {count} of the rl.sample_steps = {steps} sampler steps; "
                f"it must train between 1 and {steps - 1} (the last step, to sigma 0, is an ODE step)", fraction,
                "use e.g. 0.99, or a fraction f with 1 <= floor(f x rl.sample_steps) <= rl.sample_steps - 1")
