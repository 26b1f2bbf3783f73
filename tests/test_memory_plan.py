"""planning/memory.py: `plan`'s memory per rank, against hand-worked values, the real classes'
parameter counts, and the measured peak RSS of training steps on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_rl.models.architectures import TINY_TRANSFORMER
from cosmos_rl.planning import memory
from cosmos_rl.planning.media_cost import activation_bytes

HERE = Path(__file__).resolve().parent
TINY = dict(TINY_TRANSFORMER, vocab_size=100)


def test_parameter_counts_by_hand():
    # H 64, I 128, d 16, 4 heads, 2 KV heads, L 2, V 100, P 16. A layer: two towers' q, out 64 x 64,
    # k, v 64 x 32 (24,576), MLPs 6 x 64 x 128 (49,152), 4 RMSNorms of 64, 4 q/k norms of 16: 74,048.
    # Outside: embedding + text head 2 x 6,400, final norms 128, proj_in 1,088, proj_out 1,040,
    # timestep embedding 256 x 64 + 64 + 64 x 64 + 64 = 20,608: 35,664.
    assert memory.transformer_parameters(TINY) == 2 * 74_048 + 35_664 == 183_760
    # LoRA r 8 on all 14 linears: r x (in + out): towers' q, out 8 x 128, k, v 8 x 96, MLPs 6 x 8 x 192.
    assert memory.lora_parameters(TINY, 8) == 2 * (2 * (2 * 1024 + 2 * 768) + 6 * 1536) == 32_768
    assert memory.lora_parameters(TINY, 8, ["generation"]) == 2 * (2 * 1024 + 2 * 768) == 7_168
    assert memory.lora_parameters(TINY, 8, ["to_q"]) == 2 * 1024  # peft suffix match: `to_q` only
    assert memory.lora_parameters(TINY, 0) == 0


def test_parameter_counts_match_the_built_classes():
    from diffusers import Cosmos3OmniTransformer

    from cosmos_rl.models import lora

    transformer = Cosmos3OmniTransformer(**TINY)
    assert sum(p.numel() for p in transformer.parameters()) == memory.transformer_parameters(TINY)
    lora.add_adapters(transformer, rank=8, alpha=16.0, names=["policy"], target_modules=["generation", "down_proj"])
    built = sum(t.numel() for t in lora.adapter_tensors(transformer, "policy").values())
    assert built == memory.lora_parameters(TINY, 8, ["generation", "down_proj"])


def test_vae_decode_by_hand():
    # Nano's Wan2.2-style VAE: top stage 256 x 1 channels, 4 frames per latent frame, patch 2.
    vae = dict(base_dim=160, decoder_base_dim=256, dim_mult=[1, 2, 4, 4], temperal_downsample=[False, True, True], patch_size=2)
    clip = 3 * 93 * 480 * 832
    working = 4 * 256 * 4 * 240 * 416
    assert memory.vae_decode_bytes(vae, 93, 480, 832) == 4 * (clip + working) == 2_081_464_320
    image_vae = dict(base_dim=8, dim_mult=[1, 1], temperal_downsample=[False], patch_size=2)
    assert memory.vae_decode_bytes(image_vae, 1, 32, 32) == 4 * (3 * 32 * 32 + 4 * 8 * 1 * 16 * 16)


def _terms(**over):
    args = dict(
        params=1000, trainable=100, adapter_params=100, adapters=2, full_reference=False, shards=4,
        compute_bytes=2, layers=10, kept_gathered_in_training=True, train_activation=5000, train_layer=300,
        sample_activation=70, vae_params=50, vae_decode=900,
    )  # fmt: skip
    return memory.memory_terms(**{**args, **over})


def test_memory_terms_by_hand():
    t = _terms()
    # 4 x 1000 / 4; adapters 4 x 100 x 2 / 4; grads 4 x 100 / 4; AdamW 8 x 100 / 4; gathered 2 x (1000 + 200)
    assert (t["weights"], t["adapters"], t["reference"], t["gradients"], t["optimizer"]) == (1000, 200, 0, 100, 200)
    assert t["gathered_weights"] == 2400 and t["vae_weights"] == 200
    persistent = 1000 + 200 + 200 + 200
    assert t["sampling"] == persistent + 2400 + 70 + 900 == 4970
    assert t["training"] == persistent + 100 + 2400 + 5000 + 300 == 9400 == t["peak"]
    # A step that reshards after every layer holds one layer's gathered weights: 2400 / 10.
    assert _terms(kept_gathered_in_training=False)["training"] == 9400 - 2400 + 240
    # A full fine-tune's frozen copy; one process: nothing gathered, nothing divided.
    full = _terms(adapter_params=0, adapters=0, trainable=900, full_reference=True, shards=1)
    assert (full["weights"], full["reference"], full["gradients"], full["optimizer"]) == (4000, 4000, 3600, 7200)
    assert full["gathered_weights"] == 0 and full["training"] == 4000 + 4000 + 7200 + 200 + 3600 + 5000 + 300


# Three steps on CPU, float32, one process, images of 32 x 32 latents (256 vision tokens each at patch
# 2). The widths make the weights, the AdamW moments and the activations tens of MB, so what RSS
# adds beyond tensors stays small against them; attention's two heads keep CPU's attention cheap.
VALIDATION_TRANSFORMER = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
    head_dim=128, latent_channel=4, latent_patch_size=2, patch_latent_dim=16, rope_axes_dim=[32, 16, 16], vocab_size=512,
)  # fmt: skip
SIZES = (  # (samples, LoRA rank, gradient checkpointing)
    (4, 16, False),
    (4, 0, False),
    (8, 0, True),
)


def _estimate(samples: int, rank: int, checkpointing: bool) -> int:
    t = VALIDATION_TRANSFORMER
    params, adapter = memory.transformer_parameters(t), memory.lora_parameters(t, rank)
    tokens = 16 * 16
    return memory.memory_terms(
        params=params, trainable=adapter or params - 512 * 256, adapter_params=adapter, adapters=1 if rank else 0,
        full_reference=False, shards=1, compute_bytes=4, layers=4, kept_gathered_in_training=False,
        train_activation=samples * activation_bytes(tokens, t, "float32", checkpointing),
        train_layer=samples * activation_bytes(tokens, {**t, "num_hidden_layers": 1}, "float32", False),
        sample_activation=0, vae_params=0, vae_decode=0,
    )["training"]  # fmt: skip


def test_the_training_estimate_is_within_15_percent_of_the_measured_peak_rss():
    specs = [
        {"transformer": VALIDATION_TRANSFORMER, "latent": [samples, 4, 1, 32, 32], "lora_rank": rank, "checkpointing": ck}
        for samples, rank, ck in SIZES
    ]  # fmt: skip
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # see tests/_memory_step.py
    result = subprocess.run([sys.executable, str(HERE / "_memory_step.py"), json.dumps(specs)],
                            capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout)
    for (samples, rank, ck), growth in zip(SIZES, measured):
        estimate = _estimate(samples, rank, ck)
        assert estimate > 50 * 2**20  # the model terms, not RSS noise, are what is compared
        assert growth == pytest.approx(estimate, rel=0.15), (samples, rank, ck, growth / 2**20, estimate / 2**20)


def test_plan_prints_the_memory_of_a_shapes_sft_run():
    """sft_shapes_cpu: the shapes preset (H 128, I 256, 4 layers, no vocabulary in the preset's
    config), a full fine-tune on one float32 rank, 64 images of 32 x 32 (8 x 8 latents, 16 tokens).
    Weights 4 P; AdamW 8 T with T = P (no text head rows counted); activations 64 x 4 layers x 16
    tokens x (12 x 128 + 4 x 256) x 4 B = 41,943,040 B, the backward transient a quarter of that."""
    import io

    from rich.console import Console

    from cosmos_rl.config import load
    from cosmos_rl.models.architectures import SHAPES_TRANSFORMER
    from cosmos_rl.planning import plan
    from cosmos_rl.planning.render import render_plan

    path = HERE.parent / "manifests" / "sft_shapes_cpu.toml"
    built = plan.build(load.load(path, []), str(path))
    m = built["memory"]
    params = memory.transformer_parameters(SHAPES_TRANSFORMER)
    gib = lambda n: round(n / 2**30, 3)
    assert m["shards"] == 1 and m["train_samples_per_rank"] == 64 and m["parameters"]["trainable"] == params
    t = m["terms_gib"]
    assert (t["weights"], t["optimizer"], t["gathered_weights"], t["reference"]) == (gib(4 * params), gib(8 * params), 0, 0)
    assert t["train_activations"] == gib(41_943_040) and t["backward_transient"] == gib(41_943_040 // 4)
    assert t["peak"] == max(t["sampling"], t["training"])
    # Two context-parallel degrees divide the preset's 4 heads beyond 1: 1, 2, 4, each with and without checkpointing.
    assert [(r["context_parallel"], r["gradient_checkpointing"]) for r in m["by_layout"]] == [
        (1, False), (1, True), (2, False), (2, True), (4, False), (4, True)]  # fmt: skip
    out = io.StringIO()
    render_plan(Console(file=out, width=400), built)
    text = out.getvalue()
    assert "memory per rank" in text and f"peak {t['peak']:g} GiB = max(sampling {t['sampling']:g}, training {t['training']:g})" in text
