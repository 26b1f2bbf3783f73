"""The `pusht` preset: the Push-T world-model base, a small Cosmos3 with action heads.

Its networks are `models.architectures.PUSHT_TRANSFORMER` (the video base's transformer at latent
patch 4 with action heads: 2 columns, 21 embodiment domains, `pusht` = domain 4) and `PUSHT_VAE`
(the video VAE in the fine layout: a latent frame a frame, 16 x 16 cells at 32 x 32). The float16
weights and `manifest.json` live in `cosmos_rl/models/presets/pusht/`, written by
`python -m cosmos_rl.commands.pusht_base_build build` (its `--out`) and checked against the
manifest's sha256 on every load, as the `shapes` bases are.

`model.preset = "pusht"` (docs/world.md, "The Push-T base"). The action heads are always built:
the preset is a world model, read and written in action rows (`[model.action] embodiment = "pusht"`).
"""

from __future__ import annotations

import copy
from pathlib import Path

from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

from cosmos_rl.core.errors import UserError
from cosmos_rl.models.architectures import PUSHT_PATCH, PUSHT_TRANSFORMER, PUSHT_VAE
from cosmos_rl.models.build import ModelParts, flow_scheduler
from cosmos_rl.models.shapes_preset import MANIFEST, load_shapes_base, read_manifest
from cosmos_rl.models.tokenizer import build_tiny_tokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "presets" / "pusht"
REBUILD = "python -m cosmos_rl.commands.pusht_base_build build"


def pusht_architecture(seed: int, patch: int | None = None) -> ModelParts:
    """The Push-T base's networks with random weights from `seed` (CPU, float32, eval mode);
    `patch` replaces the transformer's latent patch (the build's `--patch`; None: the preset's)."""
    import torch

    transformer_config = copy.deepcopy(PUSHT_TRANSFORMER)
    if patch is not None:
        transformer_config.update(latent_patch_size=patch, patch_latent_dim=transformer_config["latent_channel"] * patch * patch)
    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(**copy.deepcopy(PUSHT_VAE))
        transformer = Cosmos3OmniTransformer(**transformer_config, vocab_size=len(tokenizer))
    transformer.eval()
    vae.eval()
    return ModelParts(transformer, vae, tokenizer, flow_scheduler(), prompt_template="minimal")


def build_pusht(with_extra_heads: bool) -> ModelParts:
    """The `pusht` entry of `models.build.PRESETS`: the shipped Push-T base, its action heads
    always built (it has no sound heads to add)."""
    if with_extra_heads:
        raise ValueError("the pusht preset has no sound heads (its action heads are always built)")
    # The build's --patch 2 makes other patch projections: said in one line, not as a state-dict shape error.
    patch = read_manifest(WEIGHTS_DIR, REBUILD).get("recipe", {}).get("patch", PUSHT_PATCH)
    if patch != PUSHT_PATCH:
        raise UserError(f"model.preset: {WEIGHTS_DIR / MANIFEST} is a base built at --patch {patch}, and the pusht preset's "
                        f"transformer has latent patch {PUSHT_PATCH}; rebuild it with `{REBUILD}` (its default --patch {PUSHT_PATCH})")
    return load_shapes_base(WEIGHTS_DIR, pusht_architecture, REBUILD)
