"""SFT's rules for what `rl.train = "vae"` trains: the whole VAE (no LoRA) and its loss weighting."""

from __future__ import annotations

from cosmos_rl.core import schema
from cosmos_rl.config.preflight_rules import Rules


def vae_stage_rules(c: schema.RunConfig, rl: schema.SFTConfig, r: Rules) -> None:
    if rl.foreground_weight < 1:
        r.error("rl.foreground_weight", "must be at least 1 (foreground pixels weigh no less than the background)", rl.foreground_weight,
                "use 1 for plain MSE, or e.g. 10 on plain-background data")
    elif rl.foreground_weight != 1 and rl.train != "vae":
        r.error("rl.foreground_weight", "weights the VAE's reconstruction loss, and this run trains the transformer", rl.foreground_weight,
                'remove it, or set rl.train = "vae"')
    if rl.train == "vae" and c.model.lora.rank > 0:
        r.error("model.lora.rank", "rl.train = \"vae\" trains every VAE weight; LoRA adapts the transformer only", c.model.lora.rank,
                "set model.lora.rank = 0")
