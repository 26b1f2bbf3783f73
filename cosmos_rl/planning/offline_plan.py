"""What `plan` shows of an offline run (DPO, SFT): the roles, pairs or samples per step and per
data-parallel rank, the data and validation sets.

The registry entries name these sections (config/algorithms.py); `plan.build` calls the one of the
run's algorithm. Pure, as plan.py.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.core import schema
from cosmos_rl.planning.media_cost import sample_costs
from cosmos_rl.planning.plan import ray_layout, world_size


def sft_section(config: schema.RunConfig, base_dir: Path) -> dict:
    rl, size = config.rl, world_size(config)[0]
    out = {
        "roles_per_process": ["data", "policy"],
        "per_step": _per_step("samples", rl.samples_per_step, config, size),
        "data": f"{_shard_count(rl.data.shards)} webdataset shard(s)" if rl.data.shards else f"JSONL {rl.data.jsonl}",
        "trains": "the VAE (autoencoder)" if rl.train == "vae" else "the transformer (flow matching)",
    }
    if config.grid.backend == "ray":
        out["ray"] = ray_layout(config, size)
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
        out["ray"] = ray_layout(config, ranks)
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
