"""Preflight of `grid.context_parallel`: what a context-parallel group of N ranks needs of the model
and the samples (models/packing.set_context_parallel, dist/context_parallel.py; docs/long_clips.md).

Each rank of a group holds 1/N of a sample's vision (and action) tokens, and attention runs on
heads/N of the heads, so N must divide the attention heads and the tokens of every sample (its
vision tokens, plus its action rows under an action-mode condition; checked per sample, so any
batch splits). KV heads that do not divide are repeated (a warning: more all-to-all bytes).
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.config import algorithms
from cosmos_rl.config.architecture import action_rows_per_sample, run_architecture, sample_latent
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema

KEY = "grid.context_parallel"


def _fits(sizes: list[int]) -> str:
    # The group sizes above 1 that split every count in `sizes`, for the fix.
    common = [d for d in range(2, min(sizes) + 1) if all(size % d == 0 for size in sizes)][:6]
    return f"set {KEY} to one of {common}" if common else f"set {KEY} = 1"


def context_parallel_rules(c: schema.RunConfig, r: Rules) -> None:
    n = c.grid.context_parallel
    r.at_least(KEY, n, 1)
    if n <= 1:
        return
    entry = algorithms.of(c)
    if not entry.context_parallel:
        # Its training loop does not feed a context group one sample: refusing N > 1 keeps a run
        # from silently training without it (or N times over).
        wired = [name for name in algorithms.names() if algorithms.get(name).context_parallel]
        r.error(KEY, f"rl.algorithm = {entry.name!r} does not run context parallel in this release (wired: "
                f"{', '.join(wired) or 'none'}; docs/long_clips.md)", n, f"set {KEY} = 1, or use rl.algorithm = {wired[0]!r}" if wired else f"set {KEY} = 1")
        # The sizes below are still checked: a run meant for later hears everything at once.
    if c.grid.grouping == "per_role":
        # DPO's data actor deals pairs by rank, not by context group.
        r.error(KEY, 'runs with grid.grouping = "single" only (the per_role data actor deals pairs by rank, not by context group)',
                n, f'set grid.grouping = "single", or {KEY} = 1')
    ranks, derivation = entry.world_size(c)
    ranks = ranks if ranks >= 1 else None  # a world below 1 is refused on its own key
    architecture = run_architecture(c, Path(r.base_dir))
    if architecture is None:  # an unreadable folder config is model.path's problem, on its own key
        heads = kv_heads = None
        counts: list[int] = []
    else:
        transformer, vae = architecture
        heads, kv_heads = int(transformer["num_attention_heads"]), int(transformer["num_key_value_heads"])
        latent = sample_latent(c, transformer, vae)  # None: a size the VAE cannot take (model.height/width)
        rows = action_rows_per_sample(c)  # None: an unknown model.condition.kind (reported there)
        counts = [] if latent is None or rows is None else [latent[1]] + ([latent[1] + rows] if rows else [])
    # Every count N must divide, so the fix names the sizes that divide all of them.
    fix = _fits([x for x in (ranks, heads, *counts) if x is not None])
    if ranks is not None and ranks % n:
        r.error(KEY, f"must divide the run's {ranks} ranks (each group of N ranks shares its samples; the world is "
                f"{derivation})", n, fix)
    if heads is not None and heads % n:
        r.error(KEY, f"does not divide the model's {heads} attention heads (each rank attends with heads / N of them)", n, fix)
    elif kv_heads is not None and kv_heads % n:
        r.warn(KEY, f"does not divide the model's {kv_heads} KV heads: they are repeated to {heads} before the all-to-all "
               f"({heads // kv_heads}x the key/value traffic)", n, f"{_fits([heads, kv_heads])} to split them as they are")
    for count in counts:
        if count % n:
            what = f"{counts[0]} vision tokens + {count - counts[0]} action rows = {count}" if count != counts[0] else f"{count} vision tokens"
            r.error(KEY, f"does not divide a sample's {what} (each rank holds 1/N of them)", n,
                    f"{fix}, or change model.height/width/num_frames")
            break
