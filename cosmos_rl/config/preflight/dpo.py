"""DPO's rules (docs/dpo.md): the data-parallel grid, pairs per step, the data sources and explicit
validation. The registry names `dpo_rules` (config/algorithms.py)."""

from __future__ import annotations

from cosmos_rl.config.preflight.data import data_source_rules, sources
from cosmos_rl.config.preflight.grid import data_parallel_grid
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema


MINE_SUMMARY = "mine.json"  # what `cosmos-rl pairs mine` writes beside its shards (commands/mining/shards.SUMMARY_FILE)


def mined_pairs_rules(c: schema.RunConfig, rl: schema.DPOConfig, r: Rules) -> None:
    """Shards mined by `cosmos-rl pairs mine` carry a `mine.json` beside them that says what their
    pairs are: a world model's predicted futures (`mode`, `suite`: trained only under that
    `[model.condition]`) or captions' images (trained only without one), of `frames` frames at
    `image_size`. Each shard folder's summary is checked against the run; shards without one are
    the user's own and are read as they are."""
    from pathlib import Path

    from cosmos_rl.core.errors import UserError
    from cosmos_rl.core.files import read_user_json

    table = c.model.condition
    for key in ("rl.data.shards", "rl.validation.data.shards"):
        shards = rl.data.shards if key == "rl.data.shards" else rl.validation.data.shards
        for folder in sorted({Path(s).parent for s in shards}):
            path = folder if folder.is_absolute() else r.base_dir / folder
            path = path / MINE_SUMMARY
            if not path.is_file():
                continue
            try:
                summary = read_user_json(path, key, "pairs summary")
            except UserError as exc:
                r.error(key, f"its {MINE_SUMMARY} cannot be read ({exc})", str(path), "mine the pairs again, or delete the file")
                continue
            if not isinstance(summary, dict):
                r.error(key, f"its {MINE_SUMMARY} is not the summary cosmos-rl pairs mine writes", str(path), "mine the pairs again, or delete the file")
                continue
            mode, suite = summary.get("mode"), summary.get("suite")
            if mode and (table.kind != mode or table.source != suite):
                r.error(key, f"holds {mode} pairs of {suite} window keys ({path}), and this run's [model.condition] is kind "
                        f"{table.kind!r}, source {table.source!r}", str(folder),
                        f'set [model.condition] kind = "{mode}", source = "{suite}" with [model.action], or use pairs mined from captions')
            elif not mode and table.kind != "none":
                r.error(key, f"holds pairs mined from captions ({path}), and this run's [model.condition] kind is {table.kind!r}",
                        str(folder), "remove [model.condition], or mine window keys' futures (cosmos-rl pairs mine --reward pusht_forward_partial)")
            frames, size = summary.get("frames"), summary.get("image_size")
            if isinstance(frames, int) and frames != c.model.num_frames:
                r.error(key, f"holds pairs of {frames}-frame clips ({path}), and model.num_frames is {c.model.num_frames}", str(folder),
                        f"set model.num_frames = {frames}, or mine at the run's clip length (--frames)")
            height = c.model.height if c.model.height is not None else c.model.image_size
            width = c.model.width if c.model.width is not None else c.model.image_size
            want = height if height == width else [height, width]
            # Images are resized to the run's size when read (data.images); clips never are.
            if isinstance(frames, int) and frames > 1 and size is not None and height is not None and width is not None and size != want:
                r.error(key, f"holds pairs of {size}-pixel frames ({path}), and the run trains {want}", str(folder),
                        "set model.height and model.width (or model.image_size) to the pairs' size, or mine at the run's size (--image-size)")


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
    mined_pairs_rules(c, rl, r)
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
