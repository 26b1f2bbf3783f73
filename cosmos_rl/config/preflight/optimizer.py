"""`rl.optimizer`'s rules: AdamW's numbers and the learning-rate schedule (warm-up, decay)."""

from __future__ import annotations

from cosmos_rl.core import schema
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.models.lr_schedule import lr_factor


def optimizer_rules(rl: schema.RLBase, r: Rules) -> None:
    """Every algorithm's `rl.optimizer` table, and where its decay ends against the run's steps."""
    _adamw(rl.optimizer, r)
    _decay_within_run(rl, r)


def _adamw(o: schema.OptimizerConfig, r: Rules) -> None:
    r.positive("rl.optimizer.lr", o.lr)
    r.at_least("rl.optimizer.weight_decay", o.weight_decay, 0)
    r.positive("rl.optimizer.eps", o.eps)
    r.at_least("rl.optimizer.grad_clip", o.grad_clip, 0)
    r.at_least("rl.optimizer.warmup_steps", o.warmup_steps, 0)
    if not 0 <= o.min_lr_ratio <= 1:
        r.error("rl.optimizer.min_lr_ratio", "must be in [0, 1] (the decay's end as a fraction of lr)", o.min_lr_ratio,
                "use e.g. 0 (decay to nothing) or 0.1")
    if o.decay == "none" and (o.decay_steps != 0 or o.min_lr_ratio != 0):
        key, value = ("rl.optimizer.decay_steps", o.decay_steps) if o.decay_steps != 0 else ("rl.optimizer.min_lr_ratio", o.min_lr_ratio)
        r.error(key, "is set but rl.optimizer.decay is \"none\", so it would shape nothing", value,
                'set rl.optimizer.decay = "linear" or "cosine", or remove the key')
    if o.decay != "none" and o.decay_steps <= o.warmup_steps:
        r.error("rl.optimizer.decay_steps", f"must be greater than rl.optimizer.warmup_steps = {o.warmup_steps} with "
                f"rl.optimizer.decay = \"{o.decay}\" (the decay runs from the warm-up's end to this optimizer step)",
                o.decay_steps, "set it to the run's optimizer steps, e.g. rl.max_steps")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        r.error("rl.optimizer.betas", "must be two numbers in [0, 1)", o.betas, "use e.g. [0.9, 0.999]")


def _decay_within_run(rl: schema.RLBase, r: Rules) -> None:
    """A decay that ends after the run's last optimizer step is legal (a run extended on resume
    reaches it) but leaves the LR above its floor, so say where the run stops on it."""
    o = rl.optimizer
    # GRPO takes rl.updates_per_step optimizer steps a step; every other algorithm one.
    total = rl.max_steps * (rl.updates_per_step if isinstance(rl, schema.GRPOConfig) else 1)
    if o.decay == "none" or o.decay_steps <= o.warmup_steps or total <= 0 or o.decay_steps <= total:
        return
    r.warn("rl.optimizer.decay_steps", f"ends after the run's {total} optimizer steps, so the run stops at "
           f"{lr_factor(o)(total - 1):.3g} x lr instead of {o.min_lr_ratio:g} x lr", o.decay_steps,
           f"set it to {total} to end the decay with the run, or keep it to extend the run on resume")
