"""SFT's rules (docs/sft.md): the data-parallel grid, samples per step, caption dropout, the
first-frame share (`condition.py`), what `rl.train = "vae"` trains, and one image-caption source.
The registry names `sft_rules` (config/algorithms.py)."""

from __future__ import annotations

from cosmos_rl.config.preflight.grid import data_parallel_grid
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.core.condition import UnknownCondition, kind_named


def kind_action_mode(name: str) -> str:
    """The action mode of a condition kind's name ("" for none, or a kind condition.py reports unknown)."""
    try:
        return kind_named(name).action_mode
    except UnknownCondition:
        return ""


def sft_rules(c: schema.RunConfig, rl: schema.SFTConfig, r: Rules) -> None:
    """SFT's rules: data-parallel grid, samples per step, caption dropout, one image-caption source."""
    data_parallel_grid(c, r)
    if c.grid.grouping == "per_role" and c.grid.backend == "ray":
        r.error("grid.grouping", "SFT has no data role to place apart: every rank reads its own share of the samples", c.grid.grouping,
                'set grid.grouping = "single"')
    dp = c.model.config.parallelism.data_parallel_shard_degree
    cp = c.grid.context_parallel
    if cp > 1 and dp >= cp and dp % cp == 0:
        dp //= cp  # a context group of cp ranks trains one share (a size that does not divide is refused on grid.context_parallel)
    if cp > 1 and rl.train == "vae":
        # Context parallelism splits the transformer's vision tokens; the VAE stage never runs it.
        r.error("grid.context_parallel", 'splits the transformer\'s tokens, and rl.train = "vae" trains the VAE', cp,
                "set grid.context_parallel = 1 for the VAE stage")
    r.at_least("rl.samples_per_step", rl.samples_per_step, 1)
    if rl.samples_per_step >= 1 and dp >= 1 and rl.samples_per_step % dp:
        r.error("rl.samples_per_step", f"must split evenly over the {dp} ranks", rl.samples_per_step, f"use a multiple of {dp}")
    if not 0 <= rl.caption_dropout < 1:
        r.error("rl.caption_dropout", "must be in [0, 1)", rl.caption_dropout, "use e.g. 0.1 (0 trains no unconditional prompt)")
    r.positive("rl.logit_std", rl.logit_std)
    vae_stage_rules(c, rl, r)
    data = rl.data
    used = [name for name in ("jsonl", "shards", "lerobot") if getattr(data, name)]
    world = bool(kind_action_mode(c.model.condition.kind))
    if not used and world:
        r.error("rl.data.lerobot", f"{c.model.condition.kind} trains on episodes (frames with their actions)", "(empty)",
                "set rl.data.lerobot to a LeRobot-format dataset folder (python -m cosmos_rl.pusht dataset DIR writes one)")
    elif not used:
        r.error("rl.data", "no image-caption data source", "", "set rl.data.shards or rl.data.jsonl (rl.data.lerobot for the world model)")
    elif len(used) > 1:
        r.error("rl.data", "more than one data source", used, "keep exactly one of rl.data.jsonl, rl.data.shards and rl.data.lerobot")
    if data.camera and not data.lerobot:
        r.error("rl.data.camera", "names a LeRobot dataset's video key, and no rl.data.lerobot is set", data.camera, "remove it, or set rl.data.lerobot")
    if data.lerobot:
        r.local_path("rl.data.lerobot", data.lerobot, kind="folder")
    if data.jsonl:
        r.local_path("rl.data.jsonl", data.jsonl, kind="file")
    for i, shard in enumerate(data.shards):
        r.shard_files(f"rl.data.shards[{i}]", shard)


def vae_stage_rules(c: schema.RunConfig, rl: schema.SFTConfig, r: Rules) -> None:
    """What `rl.train = "vae"` trains: the whole VAE (no LoRA) and its loss weighting."""
    if rl.foreground_weight < 1:
        r.error("rl.foreground_weight", "must be at least 1 (foreground pixels weigh no less than the background)", rl.foreground_weight,
                "use 1 for plain MSE, or e.g. 10 on plain-background data")
    elif rl.foreground_weight != 1 and rl.train != "vae":
        r.error("rl.foreground_weight", "weights the VAE's reconstruction loss, and this run trains the transformer", rl.foreground_weight,
                'remove it, or set rl.train = "vae"')
    if rl.unclamped_loss and rl.train != "vae":
        r.error("rl.unclamped_loss", "changes the VAE's reconstruction loss, and this run trains the transformer", rl.unclamped_loss,
                'remove it, or set rl.train = "vae"')
    pixel_weight_rules(rl, r)
    if rl.train == "vae" and c.model.lora.rank > 0:
        r.error("model.lora.rank", "rl.train = \"vae\" trains every VAE weight; LoRA adapts the transformer only", c.model.lora.rank,
                "set model.lora.rank = 0")


def pixel_weight_rules(rl: schema.SFTConfig, r: Rules) -> None:
    """`[rl.pixel_weights]`: a VAE stage's loss weighted by a suite verifier's pixel classes."""
    from cosmos_rl.suites import registry as suites

    table = rl.pixel_weights
    if not (table.suite or table.classes or table.miss != 1.0):
        return
    if rl.train != "vae":
        r.error("rl.pixel_weights", "weights the VAE's reconstruction loss, and this run trains the transformer", table.suite or table.classes or table.miss,
                'remove [rl.pixel_weights], or set rl.train = "vae"')
        return
    if not table.suite:
        r.error("rl.pixel_weights.suite", "is empty, and rl.pixel_weights.classes or .miss needs a suite's pixel classes", "",
                'set rl.pixel_weights.suite (e.g. "pusht"), or remove classes and miss')
        return
    try:
        suite = suites.get(table.suite)
    except suites.UnknownSuite as exc:
        r.error("rl.pixel_weights.suite", exc.problem, table.suite, exc.fix)
        return
    if not suite.pixel_classes:
        r.error("rl.pixel_weights.suite", f"the suite {suite.name!r} classes no pixels (its Suite has no pixel_classes)", table.suite,
                "name a suite with pixel classes (pusht), or remove [rl.pixel_weights]")
        return
    for name, weight in table.classes.items():
        if name not in suite.pixel_class_names:
            r.error(f"rl.pixel_weights.classes.{name}", f"is no pixel class of the suite {suite.name!r}", name,
                    f"use one of {', '.join(suite.pixel_class_names)}")
        elif weight < 1:
            r.error(f"rl.pixel_weights.classes.{name}", "must be at least 1 (a class's pixels weigh no less than the background)", weight,
                    "use 1 or more, e.g. 30 for a few-pixel object")
    if table.miss < 1:
        r.error("rl.pixel_weights.miss", "must be at least 1 (1 = off)", table.miss, "use 1, or e.g. 100")
    if not table.classes and table.miss == 1.0:
        r.error("rl.pixel_weights.suite", "is set, and neither rl.pixel_weights.classes nor .miss weighs anything", table.suite,
                "set classes (e.g. {agent = 30}) or miss (e.g. 100), or remove [rl.pixel_weights]")
