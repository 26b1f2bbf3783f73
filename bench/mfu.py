"""Model FLOPs of Cosmos3 forwards and steps, and MFU: pure arithmetic from the architecture.

Conventions (the ones MFU figures are usually quoted in):
- a matrix multiply of an [n, k] input by a [k, m] weight is 2 * n * k * m FLOPs, so a forward is
  2 x (weight parameters a token passes through) x tokens;
- attention adds 4 x layers x (query-key pairs) x width per forward (QK^T and AV, 2 FLOPs per
  multiply-add each), width = heads * head_dim;
- a forward with backward counts 3x its forward (the backward is twice the forward). With LoRA the
  frozen base weights get no weight gradient, so the hardware does less than that; MFU keeps the
  model-FLOP convention anyway, so it reads the same for LoRA and full fine-tuning.
Norms, RoPE, softmax and elementwise work are not counted.

Cosmos3 is a mixture of transformers: each decoder layer has a text ("und") and a vision ("gen")
pathway of identical shapes, and a token passes through exactly one of them. The weights one token
passes through are therefore one pathway's worth per layer, not all of the layer's parameters; the
embedding table is a lookup and the lm_head is unused when generating images (neither counted).
The vision projections in/out (patch_latent_dim x hidden, about 0.02 % of the total at Nano-like
sizes) are left out too.
"""

from __future__ import annotations

from typing import Optional

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' data sheets, keyed by a
# substring of torch.cuda.get_device_name(). Checked in order: the more specific names come first
# ("H100 PCIe" before "H100", "L40S" before "L40" before "L4").
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("B200", 2250.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),  # SXM; also matches GH200, whose GPU is the same part
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
)


def peak_bf16_tflops(device_name: Optional[str]) -> Optional[float]:
    """The dense bf16 peak of a device by its name, or None (CPU, or a device not in the table).

    >>> peak_bf16_tflops("NVIDIA H200"), peak_bf16_tflops("NVIDIA H100 PCIe"), peak_bf16_tflops(None)
    (989.0, 756.0, None)
    """
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops
    return None


def cosmos3_params_per_token(
    *, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, layers: int, lora_rank: int = 0
) -> int:
    """Weight parameters one token passes through: one pathway of every layer (see the module docstring).

    Per pathway: q and o are hidden x (heads * head_dim), k and v hidden x (kv_heads * head_dim),
    the gated MLP 3 x hidden x intermediate. LoRA of rank r on a [in -> out] linear adds
    r * (in + out) (its A and B); `lora_rank` counts one active adapter on all seven of them, which
    is what the default target modules adapt.

    Hand-worked (hidden 64, intermediate 128, 4 heads, 2 kv heads, head_dim 16, 2 layers):
    q, o 64 * 64 = 4096 each; k, v 64 * 32 = 2048 each; MLP 3 * 64 * 128 = 24576;
    a pathway 4096 * 2 + 2048 * 2 + 24576 = 36864; 2 layers 73728.
    LoRA rank 8: in+out of q, o 128 each, k, v 96 each, gate, up, down 192 each: 1024 * 8 = 8192 per
    layer; 2 layers 16384 more: 90112.
    """
    attn_width, kv_width = heads * head_dim, kv_heads * head_dim
    shapes = [
        (hidden, attn_width),  # q
        (hidden, kv_width),  # k
        (hidden, kv_width),  # v
        (attn_width, hidden),  # o
        (hidden, intermediate),  # gate
        (hidden, intermediate),  # up
        (intermediate, hidden),  # down
    ]
    dense = sum(i * o for i, o in shapes)
    lora = lora_rank * sum(i + o for i, o in shapes)
    return layers * (dense + lora)


def cosmos3_attention_pairs(text_lens: list[int], vision_lens: list[int], *, text_reused: bool = False) -> int:
    """Query-key pairs the packed attention evaluates for a batch, each sample on its own.

    A sample's text attends its own text (Lt^2, counted in full although it is causal: the usual
    MFU convention), its vision tokens attend its text and its vision (Lv * (Lt + Lv)); no sample
    sees another. Hand-worked: one sample of 10 text and 4 vision tokens: 100 + 4 * 14 = 156;
    two of them: 312. A clip's vision tokens are all of its latent frames' patches.

    `text_reused`: a forward that reads the text tower's held keys/values (models/text_kv.py) runs
    no text queries, so only the vision rows count: the sample above, 4 * 14 = 56.
    """
    if len(text_lens) != len(vision_lens):
        raise ValueError(f"{len(text_lens)} text lengths for {len(vision_lens)} vision lengths")
    text_pairs = 0 if text_reused else sum(t * t for t in text_lens)
    return text_pairs + sum(v * (t + v) for t, v in zip(text_lens, vision_lens))


def forward_flops(*, params_per_token: int, tokens: int, layers: int, attn_width: int, attention_pairs: int) -> int:
    """FLOPs of one forward: 2 * params * tokens + 4 * layers * pairs * width.

    Hand-worked (the docstring examples above: 73728 params, one sample of 10 + 4 = 14 tokens,
    156 pairs, 2 layers, width 64): 2 * 73728 * 14 = 2064384; 4 * 2 * 156 * 64 = 79872;
    total 2144256.
    """
    return 2 * params_per_token * tokens + 4 * layers * attention_pairs * attn_width


def step_flops(forward: int, *, no_grad_forwards: int = 0, grad_forwards: int = 0) -> int:
    """FLOPs of a step made of forwards without gradient (1x each) and forwards with backward (3x each).

    E.g. an NFT step with an old-policy forward and a policy forward+backward of the same batch
    is 1 + 3 = 4 forwards: step_flops(2144256, no_grad_forwards=1, grad_forwards=1) = 8577024.
    """
    return forward * (no_grad_forwards + 3 * grad_forwards)


def mfu(flops: float, seconds: float, peak_tflops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation: flops / (seconds * peak); None when the peak is unknown.

    Hand-worked: 989e12 FLOPs in 2 s on a 989 TFLOP/s device is 0.5.
    """
    if peak_tflops is None or seconds <= 0:
        return None
    return flops / (seconds * peak_tflops * 1e12)
