"""Every cross-field rule of the specs, checked before any worker starts.

``check(config, base_dir)`` returns every problem at once (errors and warnings); it does cheap
filesystem checks only and never imports torch, ray or diffusers. ``machine_problems`` judges the
machine `train` runs on, which `validate` never asks.

The rules live by concern beside this entry: the shared ones (`rules` the collector, `numbers`,
`job`, `model`, `media`, `grid`, `context_parallel`, `optimizer`, `data`, `rewards`, `evaluation`, `condition`, and
`online` for every online algorithm) and one file per algorithm (`dpo`, `sft`, `nft`, `grpo`),
whose rules function the algorithm registry names (config/algorithms.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from cosmos_rl.config import algorithms
from cosmos_rl.config.preflight.condition import condition_rules
from cosmos_rl.config.preflight.context_parallel import context_parallel_rules
from cosmos_rl.config.preflight.evaluation import eval_rules
from cosmos_rl.config.preflight.grid import GRID_TIMEOUT_MAX_S, RDZV_ENV, grid_rules
from cosmos_rl.config.preflight.job import job_rules
from cosmos_rl.config.preflight.media import frame_rules, size_rules
from cosmos_rl.config.preflight.model import base_rules, lora_rules
from cosmos_rl.config.preflight.numbers import finite_rule
from cosmos_rl.config.preflight.online import nft_shapes
from cosmos_rl.config.preflight.optimizer import optimizer_rules
from cosmos_rl.config.preflight.rules import Rules, seed_rule
from cosmos_rl.core import schema
from cosmos_rl.core.problems import Problem

# The names callers reach as `preflight.NAME`: the two entries, and the grid constants and online
# role shapes that `plan` and the tests read (each defined in the module named above).
__all__ = ["check", "machine_problems", "RDZV_ENV", "GRID_TIMEOUT_MAX_S", "nft_shapes"]


def check(config: schema.RunConfig, base_dir: Path | str = ".") -> list[Problem]:
    rules = Rules(Path(base_dir))
    finite_rule(config, rules)
    common_rules(config, rules)
    algorithm = algorithms.of(config)
    if config.model.num_frames > 1 and not algorithm.video and not isinstance(config.rl, schema.NFTConfig):
        # An algorithm with rl.modality (NFT) says this under that key instead.
        video_ones = ", ".join(f'"{a.name}"' for a in map(algorithms.get, algorithms.BUILT_IN) if a.video)
        rules.error("model.num_frames", f"rl.algorithm = \"{algorithm.name}\" does not train video in this release", config.model.num_frames,
                    f"set model.num_frames = 1, or train video with rl.algorithm = {video_ones}")
    condition_rules(config, rules)
    own_rules = algorithm.resolve("preflight")
    if own_rules is not None:
        own_rules(config, config.rl, rules)
    eval_rules(config, config.rl.eval, rules)
    return rules.problems


def common_rules(c: schema.RunConfig, r: Rules) -> None:
    """Every algorithm's rules, called in the order their problems are reported."""
    job_rules(c, r)
    lora_rules(c.model.lora, r)
    size_rules(c.model, r)
    frame_rules(c.model, r)
    grid_rules(c, r)
    context_parallel_rules(c, r)
    seed_rule("job.seed", c.job.seed, r)
    r.at_least("grid.cpus_per_rank", c.grid.cpus_per_rank, 0)
    optimizer_rules(c.rl, r)
    base_rules(c, r)


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
