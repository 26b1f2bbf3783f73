"""`plan`'s `memory` section: peak memory per rank, term by term, from the configs alone.

Pure arithmetic over a transformer config dict (the keys `config.architecture` reads), a VAE
config dict and the run's shapes; nothing is built. Each function's docstring states its formula.
`B` below is bytes per element: 4 for float32 (master weights, gradients, AdamW moments, the VAE:
docs/scale.md "Precision"), the compute dtype's (2 for bfloat16) for weights FSDP2 all-gathers.

What it leaves out: the CUDA context and the caching allocator's slack (a few GiB on a GPU: keep
that headroom), the prompt's text tokens (tens to hundreds per sample, vision tokens dominate),
NCCL buffers, FSDP2's transient per-layer gradient buffers, and the heads of a checkpoint a run
does not build (sound, action). Validated on CPU against measured peak RSS of one training step
(tests/test_memory_plan.py), see docs/long_clips.md "Memory per rank".
"""

from __future__ import annotations

from cosmos_rl.models.towers import DEFAULT_TARGET_MODULES, TOWERS

FLOAT32 = 4
TIME_EMBED_IN = 256  # Cosmos3OmniTransformer's TimestepEmbedding(in_channels=256)
# How many full-resolution top-stage feature maps a Wan VAE decoder keeps at once while it decodes
# one latent frame: a residual block's input, its two convolutions' outputs and the causal cache.
VAE_DECODE_MAPS = 4


def _dims(t: dict) -> tuple[int, int, int, int, int, int]:
    hidden, width, layers = int(t["hidden_size"]), int(t["intermediate_size"]), int(t["num_hidden_layers"])
    heads, kv_heads = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
    head_dim = int(t.get("head_dim") or hidden // heads)
    return hidden, width, layers, heads, kv_heads, head_dim


def layer_linears(t: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of every linear of one decoder layer, by its path below `layers.<i>.`:
    per tower q, k, v, out (q and out nh x d wide, k and v nkv x d) and a SwiGLU MLP (H -> I -> H)."""
    hidden, width, _, heads, kv_heads, head_dim = _dims(t)
    q, kv = heads * head_dim, kv_heads * head_dim
    out: dict[str, tuple[int, int]] = {}
    for q_name, k_name, v_name, o_name, mlp in (
        ("self_attn.to_q", "self_attn.to_k", "self_attn.to_v", "self_attn.to_out", "mlp"),
        ("self_attn.add_q_proj", "self_attn.add_k_proj", "self_attn.add_v_proj", "self_attn.to_add_out", "mlp_moe_gen"),
    ):
        out.update({q_name: (hidden, q), k_name: (hidden, kv), v_name: (hidden, kv), o_name: (q, hidden)})
        out.update({f"{mlp}.gate_proj": (hidden, width), f"{mlp}.up_proj": (hidden, width), f"{mlp}.down_proj": (width, hidden)})
    return out


def transformer_parameters(t: dict) -> int:
    """Parameters of the built text-to-media transformer:
    L x [ sum of the layer's 14 linears (in x out) + 4 H (two towers' two RMSNorms) + 4 d (q/k norms)
          + d more when `use_und_k_norm_for_gen` ]
    + 2 V H (token embedding, text head) + 2 H (final norms) + (P H + H) (proj_in) + (H P + P) (proj_out)
    + (256 H + H) + (H H + H) (timestep embedding), with V = vocab_size (0 when the config names none:
    a preset's tokenizer rows are left out), P = patch_latent_dim. No attention biases (the class default)."""
    hidden, _, layers, _, _, head_dim = _dims(t)
    per_layer = sum(i * o for i, o in layer_linears(t).values()) + 4 * hidden + 4 * head_dim
    if t.get("use_und_k_norm_for_gen"):
        per_layer += head_dim
    vocab, patch = int(t.get("vocab_size") or 0), int(t["patch_latent_dim"])
    rest = 2 * vocab * hidden + 2 * hidden + (patch * hidden + hidden) + (hidden * patch + patch)
    rest += (TIME_EMBED_IN * hidden + hidden) + (hidden * hidden + hidden)
    return layers * per_layer + rest


def lora_parameters(t: dict, rank: int, targets: list[str] | tuple[str, ...] = ()) -> int:
    """Parameters of one LoRA adapter: r x (in + out) for every decoder-layer linear a target names
    (peft's suffix match of a plain name, a tower name's paths; empty = the defaults: all 14), x L."""
    if rank <= 0:
        return 0
    names = list(targets) or list(DEFAULT_TARGET_MODULES)
    _, _, layers, _, _, _ = _dims(t)

    def hit(path: str) -> bool:
        return any(path in TOWERS[n] if n in TOWERS else (path == n or path.endswith("." + n)) for n in names)

    return layers * sum(rank * (i + o) for path, (i, o) in layer_linears(t).items() if hit(path))


def vae_decode_bytes(vae: dict, frames: int, height: int, width: int) -> int:
    """One clip's decode in float32: the decoded clip, 3 x F x H x W, plus the decoder's working set
    while it decodes one latent frame, VAE_DECODE_MAPS (4) maps of C x f x (H / p) x (W / p) at its
    top stage: C = decoder_base_dim (else base_dim) x dim_mult[0] channels, f = 4 frames out per latent
    frame when the VAE compresses time (else 1), p = patch_size (1 when unset)."""
    channels = int(vae.get("decoder_base_dim") or vae["base_dim"]) * int(vae["dim_mult"][0])
    per_latent = 4 if any(vae.get("temperal_downsample") or ()) else 1
    patch = int(vae.get("patch_size") or 1)
    working = VAE_DECODE_MAPS * channels * min(per_latent, frames) * (height // patch) * (width // patch)
    return FLOAT32 * (3 * frames * height * width + working)


def memory_terms(
    *, params: int, trainable: int, adapter_params: int, adapters: int, full_reference: bool, shards: int,
    compute_bytes: int, layers: int, kept_gathered_in_training: bool, train_activation: int, train_layer: int,
    sample_activation: int, vae_params: int, vae_decode: int,
) -> dict[str, int]:
    """Bytes per rank of each term and of the two phases' peaks; `shards` is the FSDP2 world (1 =
    unsharded: one process, nothing gathered). T = `trainable`: the policy adapter's A under LoRA, else
    every weight but the text head (no image loss reaches it):
      weights     = 4 P / S                  (float32 master shards)
      adapters    = 4 A n / S                (n adapters: policy, + old for NFT, + ema for GRPO)
      reference   = 4 P / S for a full fine-tune's frozen copy, else 0 (LoRA: the base, adapters off)
      gradients   = 4 T / S,   optimizer = 8 T / S (AdamW's two float32 moments)
      gathered    = c (P + n A) when S > 1 (each layer all-gathered in the compute dtype c and kept:
                    dist.fsdp.gathered_while_sampling / _while_training), else 0
      one layer   = c (P + n A) / L when S > 1 (a layer gathered for its forward and resharded after)
      vae         = 4 V (every rank holds the whole VAE), vae decode as `vae_decode_bytes`
      persistent  = weights + adapters + reference + optimizer + vae
      sampling    = persistent + gathered + sample activations + vae decode
      backward    = one layer's activations of the training batch (`train_layer`): the gradients that
                    flow back through a layer, and what it computes and frees on the way, live with
                    the kept activations (measured on CPU: without it the estimate is 10-20 % low)
      training    = persistent + gradients + (gathered, or one layer when the step does not keep them)
                    + training activations + backward
      peak        = max(sampling, training)."""
    sharded = shards > 1
    gathered = compute_bytes * (params + adapters * adapter_params) if sharded else 0
    out = {
        "weights": FLOAT32 * params // shards,
        "adapters": FLOAT32 * adapter_params * adapters // shards,
        "reference": FLOAT32 * params // shards if full_reference else 0,
        "gradients": FLOAT32 * trainable // shards,
        "optimizer": 2 * FLOAT32 * trainable // shards,
        "gathered_weights": gathered,
        "vae_weights": FLOAT32 * vae_params,
        "vae_decode": vae_decode,
        "train_activations": train_activation,
        "backward_transient": train_layer,
        "sample_activations": sample_activation,
    }
    persistent = out["weights"] + out["adapters"] + out["reference"] + out["optimizer"] + out["vae_weights"]
    out["sampling"] = persistent + gathered + sample_activation + vae_decode
    held = gathered if kept_gathered_in_training else gathered // max(layers, 1)
    out["training"] = persistent + out["gradients"] + held + train_activation + train_layer
    out["peak"] = max(out["sampling"], out["training"])
    return out
