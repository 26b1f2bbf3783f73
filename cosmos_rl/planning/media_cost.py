"""`plan`'s `media` section: what one sample is, what it costs the model, read from configs alone.

The configs come from `config.architecture` (a folder's JSON, or a preset's). Nothing is built or loaded.

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

from pathlib import Path

from cosmos_rl.config.architecture import action_rows_per_sample, run_architecture, sample_latent
from cosmos_rl.core import schema
from cosmos_rl.core.condition import Condition
from cosmos_rl.core.media import MediaSpec

HIDDEN_VECTORS_PER_LAYER = 12
MLP_VECTORS_PER_LAYER = 4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


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
    architecture = run_architecture(config, base_dir)
    if architecture is None:
        return None
    transformer, vae = architecture
    latent = sample_latent(config, transformer, vae)
    if latent is None:
        return None
    shape, tokens = latent
    used = activation_bytes(tokens, transformer, config.model.dtype, config.model.gradient_checkpointing)
    return shape, tokens, used


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


def context_parallel_section(config: schema.RunConfig, base_dir: Path) -> dict:
    """`plan`'s `context_parallel`: the group size and what one rank of a group holds (preflight
    has judged that every count divides)."""
    n = config.grid.context_parallel
    if n <= 1:
        return {"ranks": 1, "summary": "off (grid.context_parallel = 1): every rank holds whole samples"}
    out: dict = {"ranks": n, "text": "replicated on every rank of a group"}
    architecture = run_architecture(config, base_dir)
    if architecture is not None:
        transformer, vae = architecture
        heads, kv_heads = int(transformer["num_attention_heads"]), int(transformer["num_key_value_heads"])
        out["heads_per_rank"] = f"{heads // n} of {heads} in attention"
        out["kv_heads"] = f"{kv_heads}: " + ("split" if kv_heads % n == 0 else f"repeated to {heads}, then split")
        latent, rows = sample_latent(config, transformer, vae), action_rows_per_sample(config)
        if latent is not None and rows is not None:
            tokens = latent[1] + rows
            out["tokens_per_rank"] = f"{tokens // n} of a sample's {tokens} vision{' + action' if rows else ''} tokens"
    out["summary"] = f"{n} ranks per sample (Ulysses: all-to-all over heads around every attention)"
    return out
