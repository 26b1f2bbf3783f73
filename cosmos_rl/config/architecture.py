"""A run's transformer and VAE configurations and what one sample is to them, read from configs alone.

For a `model.path` folder its `transformer/config.json` and `vae/config.json` are read as bounded
JSON; a preset's come from `models.architectures`. Nothing is built or loaded (diffusers is
imported only to fill in a class default a folder's config leaves out). `plan`'s media section and
the context-parallel preflight read them.
"""

from __future__ import annotations

import math
from pathlib import Path

from cosmos_rl.checkpoint.weight_files import config_problem, read_config
from cosmos_rl.core import schema
from cosmos_rl.core.condition import UnknownCondition, kind_named
from cosmos_rl.core.media import MediaSpec, latent_shape
from cosmos_rl.models.architectures import PRESET_ARCHITECTURES
from cosmos_rl.models.folder_check import TRANSFORMER_BOUNDS, VAE_BOUNDS, with_class_defaults

# The config keys these read; a folder's config may leave any out (the class default applies).
TRANSFORMER_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "latent_patch_size", "latent_channel",
    "num_attention_heads", "num_key_value_heads",
)  # fmt: skip
VAE_KEYS = ("dim_mult", "patch_size", "temperal_downsample")


def run_architecture(config: schema.RunConfig, base_dir: Path) -> tuple[dict, dict] | None:
    """(transformer config, VAE config) of the run's model, or None when a folder's configs are
    unreadable or out of bounds (loading the folder refuses it, naming the key)."""
    model = config.model
    if model.preset is not None and not model.path:
        return PRESET_ARCHITECTURES.get(model.preset)
    folder = Path(model.path) if Path(model.path).is_absolute() else base_dir / model.path
    try:
        transformer = read_config(folder / "transformer" / "config.json", "transformer/config.json")
        vae = read_config(folder / "vae" / "config.json", "vae/config.json")
    except ValueError:
        return None
    if config_problem(transformer, TRANSFORMER_BOUNDS, folder) or config_problem(vae, VAE_BOUNDS, folder):
        return None
    return with_class_defaults("transformer", transformer, TRANSFORMER_KEYS), with_class_defaults("vae", vae, VAE_KEYS)


def sample_latent(config: schema.RunConfig, transformer: dict, vae: dict) -> tuple[list[int], int] | None:
    """(latent [C, T, h, w], vision tokens) of one sample, or None when the size is one the VAE
    cannot take (preflight reports that on its own key)."""
    try:
        channels, frames, height, width = latent_shape(MediaSpec.from_model_config(config.model), vae, transformer)
    except (ValueError, KeyError, TypeError):
        return None
    patch = int(transformer["latent_patch_size"])
    return [channels, frames, height, width], frames * math.ceil(height / patch) * math.ceil(width / patch)


def action_rows_per_sample(config: schema.RunConfig) -> int | None:
    """The action rows that follow a sample's vision tokens in the forward: under an action-mode
    condition one per frame after the first (`Condition.from_model_config`'s chunk), else 0; None
    when `model.condition.kind` names no kind (preflight reports that on its own key)."""
    try:
        kind = kind_named(config.model.condition.kind)
    except UnknownCondition:
        return None
    return int(config.model.num_frames) - 1 if kind.action_mode else 0
