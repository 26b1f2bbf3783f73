"""`plan`'s `media` section: what one sample is, what it costs the model, read from configs alone.

The configs come from `config.architecture` (a folder's JSON, or a preset's). Nothing is built or loaded.

Activation memory is an estimate of what one training forward keeps for backward per sample
(vision tokens only; the prompt adds its own tokens, a few dozen with the `minimal` template and
a few hundred with the `chat` template's system prompt). Per decoder layer and token it counts
12 hidden-size vectors (norms, q/k/v, the attention output, projections and residuals; fused
attention keeps no score matrix) and 4 MLP-width vectors (SwiGLU's gate, up, activation and
product), at the compute dtype's bytes. With gradient checkpointing only each layer's input is
kept, plus one layer's activations while it is recomputed. `memory_section` adds weights, gradients,
optimizer state and the VAE per rank (`planning.memory`); framework overheads come on top.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.config import algorithms
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
    world = algorithms.of(config).world_size(config)[0]
    out: dict = {"ranks": n, "text": "replicated on every rank of a group"}
    if world >= n and world % n == 0:  # else preflight refuses the size
        out["layout"] = (f"{world // n} data-parallel x {n} context-parallel ranks (consecutive ranks form a group; "
                         f"data cursors, seeds and [rl.eval] shares by data-parallel rank; FSDP2 over all {world})")
    if not algorithms.of(config).context_parallel:
        out["trainer"] = f"rl.algorithm = {config.rl.algorithm!r} does not run it yet (preflight refuses)"
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


def vae_parameters(vae: dict) -> int:
    """The VAE's parameter count, by building `AutoencoderKLWan` from its config on the meta device
    (shapes only, no memory): its residual and attention blocks have no closed form worth keeping.
    Imports torch and diffusers on first use."""
    import torch
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        return sum(p.numel() for p in AutoencoderKLWan.from_config(dict(vae)).parameters())


def _train_samples(config: schema.RunConfig, world: int) -> tuple[int, bool] | None:
    """(samples in one forward with grad on a rank without context parallelism, whether the step keeps
    every layer's gathered weights: `dist.fsdp.gathered_while_training` in DPO, NFT and GRPO)."""
    rl, cfg = config.rl, 2 if getattr(config.rl, "guidance", 1.0) != 1.0 else 1
    if rl.algorithm == "nft":
        return rl.prompts_per_step * (rl.timesteps_per_sample or rl.sample_steps - 1), True
    if rl.algorithm == "grpo":  # one trained SDE step of one update's rows, conditional and unconditional
        return rl.prompts_per_step // rl.updates_per_step * cfg, True
    if rl.algorithm == "dpo":  # every winner and loser of the rank
        return 2 * (rl.pairs_per_step // world), True
    if rl.algorithm == "sft":
        return max(rl.samples_per_step // world, 1), False
    return None  # an algorithm from outside the package: its step is its own, so no estimate


def _adapters(config: schema.RunConfig) -> int:
    rl = config.rl
    if rl.algorithm not in ("nft", "grpo"):
        return 1
    return 1 + int(rl.old.build_old) + int(bool(getattr(rl, "ema_decay", 0.0)))


def memory_section(config: schema.RunConfig, base_dir: Path, world: int) -> dict | None:
    """`plan`'s `memory`: peak bytes per rank by term (`planning.memory.memory_terms`), for the run's
    own gradient checkpointing, and the peak for both checkpointing settings and each context-parallel
    degree N that divides the attention heads (up to 8): N ranks per sample, the same samples per
    data-parallel rank, so FSDP2 shards over N x the world and activations divide by N."""
    from cosmos_rl.planning import memory

    architecture = run_architecture(config, base_dir)
    if architecture is None or config.rl.algorithm == "sft" and config.rl.train == "vae" or _train_samples(config, world) is None:
        return None
    transformer, vae = architecture
    latent = sample_latent(config, transformer, vae)
    if latent is None:
        return None
    _, tokens = latent
    media = MediaSpec.from_model_config(config.model)
    dtype, lora_rank = config.model.dtype, config.model.lora.rank
    # One process is unsharded (built in float32, nothing cast); FSDP2 gathers in the compute dtype.
    compute = DTYPE_BYTES[dtype] if world > 1 else DTYPE_BYTES["float32"]
    params = memory.transformer_parameters(transformer)
    adapter = memory.lora_parameters(transformer, lora_rank, list(config.model.lora.target_modules))
    trainable = adapter if lora_rank else params - int(transformer.get("vocab_size") or 0) * int(transformer["hidden_size"])
    samples, kept = _train_samples(config, world)
    online = config.rl.algorithm in ("nft", "grpo")
    rows = (config.rl.prompts_per_step if online else 1) * (2 if getattr(config.rl, "guidance", 1.0) != 1.0 else 1)
    one_layer = activation_bytes(tokens, {**transformer, "num_hidden_layers": 1}, dtype if world > 1 else "float32", False)
    common = dict(
        params=params, trainable=trainable, adapter_params=adapter, adapters=_adapters(config) if lora_rank else 0,
        full_reference=not lora_rank and config.rl.algorithm != "sft", compute_bytes=compute,
        layers=int(transformer["num_hidden_layers"]), kept_gathered_in_training=kept,
        vae_params=vae_parameters(vae), vae_decode=memory.vae_decode_bytes(vae, media.frames, media.height, media.width),
    )
    cp = config.grid.context_parallel

    def terms(checkpointing: bool, n: int) -> dict:
        act_dtype = dtype if world * n // cp > 1 else "float32"
        clip = activation_bytes(tokens, transformer, act_dtype, checkpointing)
        return memory.memory_terms(
            **common, shards=world * n // cp, train_activation=samples * cp * clip // n,
            train_layer=samples * cp * activation_bytes(tokens, {**transformer, "num_hidden_layers": 1}, act_dtype, False) // n,
            sample_activation=rows * cp * one_layer // n,
        )

    own = terms(config.model.gradient_checkpointing, cp)
    heads = int(transformer["num_attention_heads"])
    layouts = [
        {"context_parallel": n, "gradient_checkpointing": ck, "ranks": world * n // cp,
         "train_activations_gib": round(t["train_activations"] / 2**30, 2), "peak_gib": round(t["peak"] / 2**30, 2)}
        for n in (1, 2, 4, 8) if heads % n == 0
        for ck in (False, True) for t in [terms(ck, n)]
    ]  # fmt: skip
    return {
        "shards": world,
        "parameters": {"transformer": params, "lora_adapter": adapter, "trainable": trainable, "vae": common["vae_params"]},
        "train_samples_per_rank": samples,
        "terms_gib": {k: round(v / 2**30, 3) for k, v in own.items()},
        "by_layout": layouts,
        "estimate": "per rank, without the CUDA context and allocator slack (keep a few GiB); formulas and validation in docs/long_clips.md",
    }
