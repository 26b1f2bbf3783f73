"""`plan`'s `media` section: what one sample is, what it costs the model, read from configs alone.

For a `model.path` folder its `transformer/config.json` and `vae/config.json` are read as JSON; a
preset's come from `models.architectures`. Nothing is built or loaded.

Activation memory is an estimate of what one training forward keeps for backward per sample
(vision tokens only; the prompt adds its own tokens, a few dozen with the `minimal` template and
a few hundred with the `chat` template's system prompt). Per decoder layer and token it counts
12 hidden-size vectors (norms, q/k/v, the attention output, projections and residuals; fused
attention keeps no score matrix) and 4 MLP-width vectors (SwiGLU's gate, up, activation and
product), at the compute dtype's bytes. With gradient checkpointing only each layer's input is
kept, plus one layer's activations while it is recomputed. Weights, gradients, optimizer state,
the VAE and framework overheads come on top.
"""

from __future__ import annotations

import math
from pathlib import Path

from cosmos_rl.core import schema
from cosmos_rl.models.architectures import PRESET_ARCHITECTURES
from cosmos_rl.checkpoint.weight_files import config_problem, read_config
from cosmos_rl.models.folder_check import TRANSFORMER_BOUNDS, VAE_BOUNDS, with_class_defaults
from cosmos_rl.core.condition import Condition
from cosmos_rl.core.media import MediaSpec, latent_shape

HIDDEN_VECTORS_PER_LAYER = 12
MLP_VECTORS_PER_LAYER = 4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# The config keys the costs read; a folder's config may leave any out (the class default applies).
TRANSFORMER_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "latent_patch_size", "latent_channel")
VAE_KEYS = ("dim_mult", "patch_size", "temperal_downsample")


def _architecture(config: schema.RunConfig, base_dir: Path) -> tuple[dict, dict] | None:
    model = config.model
    if model.preset is not None and not model.path:
        return PRESET_ARCHITECTURES.get(model.preset)
    folder = Path(model.path) if Path(model.path).is_absolute() else base_dir / model.path
    try:
        transformer = read_config(folder / "transformer" / "config.json", "transformer/config.json")
        vae = read_config(folder / "vae" / "config.json", "vae/config.json")
    except ValueError:
        return None
    # A config out of bounds has no costs to show: loading the folder refuses it, naming the key.
    if config_problem(transformer, TRANSFORMER_BOUNDS, folder) or config_problem(vae, VAE_BOUNDS, folder):
        return None
    return with_class_defaults("transformer", transformer, TRANSFORMER_KEYS), with_class_defaults("vae", vae, VAE_KEYS)


def activation_bytes(tokens: int, transformer: dict, dtype: str, checkpointing: bool) -> int:
    """The estimate of the module docstring for one sample of `tokens` tokens."""
    hidden, width, layers = int(transformer["hidden_size"]), int(transformer["intermediate_size"]), int(transformer["num_hidden_layers"])
    per_layer = tokens * (HIDDEN_VECTORS_PER_LAYER * hidden + MLP_VECTORS_PER_LAYER * width) * DTYPE_BYTES[dtype]
    if not checkpointing:
        return layers * per_layer
    return layers * tokens * hidden * DTYPE_BYTES[dtype] + per_layer


def _mib(n: int) -> float:
    return round(n / 2**20, 2)


def sample_costs(config: schema.RunConfig, base_dir: Path) -> tuple[list[int], int, int] | None:
    """(latent [C, T, h, w], vision tokens, activation bytes) of one sample, or None when the
    configs are unreadable or the size is one the VAE cannot take (preflight reports that)."""
    architecture = _architecture(config, base_dir)
    if architecture is None:
        return None
    transformer, vae = architecture
    try:
        channels, frames, height, width = latent_shape(MediaSpec.from_model_config(config.model), vae, transformer)
    except (ValueError, KeyError, TypeError):
        return None
    patch = int(transformer["latent_patch_size"])
    tokens = frames * math.ceil(height / patch) * math.ceil(width / patch)
    used = activation_bytes(tokens, transformer, config.model.dtype, config.model.gradient_checkpointing)
    return [channels, frames, height, width], tokens, used


def media_section(config: schema.RunConfig, base_dir: Path) -> dict:
    media = MediaSpec.from_model_config(config.model)
    out: dict = {"kind": "video" if media.is_video else "image", "frames": media.frames, "size": [media.height, media.width]}
    if media.is_video:
        out.update(fps=media.fps, seconds=round(media.seconds, 3))
    if config.model.condition.kind != "none":  # preflight has judged the kind: it resolves
        out["condition"] = Condition.from_model_config(config.model).describe()
    costs = sample_costs(config, base_dir)
    if costs is None:
        return out
    latent, tokens, used = costs
    checkpointing = config.model.gradient_checkpointing
    out.update(
        latent=latent,
        vision_tokens_per_sample=tokens,
        activation_mib_per_sample=_mib(used),
        activation_estimate=("layer inputs + one recomputed layer (gradient checkpointing)" if checkpointing
                             else "every layer's activations (no gradient checkpointing)") + "; vision tokens only, see docs/video.md",
    )
    return out
