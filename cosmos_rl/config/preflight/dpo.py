"""DPO's rules (docs/dpo.md): the data-parallel grid, pairs per step, the data sources and explicit
validation. The registry names `dpo_rules` (config/algorithms.py)."""

from __future__ import annotations

from cosmos_rl.config.preflight.data import data_source_rules, sources
from cosmos_rl.config.preflight.grid import data_parallel_grid
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema


def dpo_rules(c: schema.RunConfig, rl: schema.DPOConfig, r: Rules) -> None:
    """DPO's rules (dpo.md): data-parallel grid, pairs per step, the data sources and explicit validation."""
    data_parallel_grid(c, r)
    dp = c.model.config.parallelism.data_parallel_shard_degree
    cp = c.grid.context_parallel
    if cp > 1 and dp >= cp and dp % cp == 0:
        dp //= cp  # a context group of cp ranks trains one share (a size that does not divide is refused on grid.context_parallel)
    r.positive("rl.beta", rl.beta)
    r.positive("rl.logit_std", rl.logit_std)
    r.at_least("rl.pairs_per_step", rl.pairs_per_step, 1)
    if rl.pairs_per_step >= 1 and dp >= 1 and rl.pairs_per_step % dp:
        r.error("rl.pairs_per_step", f"must split evenly over the {dp} ranks", rl.pairs_per_step, f"use a multiple of {dp}")
    validating = rl.validation.every > 0
    if not sources(rl.data):
        r.error("rl.data", "no preference data source", "", "set rl.data.synthetic_pairs, rl.data.jsonl, rl.data.shards or rl.data.factory")
    data_source_rules("rl.data", rl.data, r, needs_membership=validating)
    r.at_least("rl.validation.every", rl.validation.every, 0)
    if validating:
        r.at_least("rl.validation.max_pairs", rl.validation.max_pairs, 1)
        if not sources(rl.validation.data):
            r.error("rl.validation.data", "validation needs an explicit held-out source (never an implicit split)", "",
                    "set rl.validation.data.jsonl/shards/factory/synthetic_pairs, or rl.validation.every = 0")
        else:
            data_source_rules("rl.validation.data", rl.validation.data, r, needs_membership=True)
        if rl.data.synthetic_pairs and rl.validation.data.synthetic_pairs and rl.data.synthetic_seed == rl.validation.data.synthetic_seed:
            r.error("rl.validation.data.synthetic_seed", "equals rl.data.synthetic_seed, so validation pairs are training pairs", rl.validation.data.synthetic_seed,
                    "give the held-out generator another seed")
