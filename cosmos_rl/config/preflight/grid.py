"""Preflight rules of `[grid]`: every run's sizes and timeout, and the data-parallel family's
topology (DPO, SFT and any algorithm whose ranks split each step's data). The online family's
topology is `online.py`'s; the machine's own GPUs are the entry's `machine_problems`.
"""

from __future__ import annotations

import os

from cosmos_rl.config.preflight.rules import Rules, algorithm_name
from cosmos_rl.core import schema
from cosmos_rl.dist.addresses import ray_address_problem

RDZV_ENV = "COSMOS_RL_RDZV_ENDPOINT"
# gloo turns a timeout into an int64-nanosecond deadline, which wraps past ~292 years (9.2e9 s) and
# then times out at once; Ray turns one into int64 milliseconds and cannot take inf. A week is far
# beyond any honest collective, so anything longer is a typo or an attempt at "never".
GRID_TIMEOUT_MAX_S = 7 * 24 * 3600


def grid_rules(c: schema.RunConfig, r: Rules) -> None:
    """Every run: the data-parallel degree, nodes and GPUs at least 1, a finite collective timeout."""
    r.at_least("model.config.parallelism.data_parallel_shard_degree", c.model.config.parallelism.data_parallel_shard_degree, 1)
    r.at_least("grid.nodes", c.grid.nodes, 1)
    r.at_least("grid.gpus_per_node", c.grid.gpus_per_node, 1)
    r.positive("grid.timeout_s", c.grid.timeout_s)
    if c.grid.timeout_s > 0 and not c.grid.timeout_s <= GRID_TIMEOUT_MAX_S:
        r.error("grid.timeout_s", f"must be finite and at most {GRID_TIMEOUT_MAX_S} s (7 days)", c.grid.timeout_s,
                "a collective that takes longer is stuck; use e.g. 600, or 3600 for very slow checkpoint loads")
    # Judged here so that a typo fails validate, not ray.init minutes into train.
    problem = ray_address_problem(c.grid.ray_address) if c.grid.ray_address else None
    if problem:
        r.error("grid.ray_address", problem, c.grid.ray_address,
                'give the cluster\'s head as "host:6379", "ray://host:10001" or "auto", or leave it empty for a local cluster')


def data_parallel_grid(c: schema.RunConfig, r: Rules) -> None:
    """DPO and SFT: every rank trains its share of the step (data parallel, FSDP2)."""
    g, name = c.grid, algorithm_name(c.rl)
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
