"""bench/mfu.py: FLOP counting and MFU against values worked out by hand (see its docstrings)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cosmos_rl.models import lora
from cosmos_rl.models.build import build_preset

BENCH = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("bench_mfu", BENCH / "mfu.py")
mfu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mfu)

TINY = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, layers=2)


def test_params_per_token_tiny_by_hand():
    assert mfu.cosmos3_params_per_token(**TINY) == 73728
    assert mfu.cosmos3_params_per_token(**TINY, lora_rank=8) == 90112


def test_params_per_token_nano_by_hand():
    # q, o 4096^2 each; k, v 4096 * 1024 each; MLP 3 * 4096 * 12288: 192937984 per pathway, x 36 layers.
    nano = dict(hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, layers=36)
    assert mfu.cosmos3_params_per_token(**nano) == 6945767424


def test_params_per_token_matches_one_pathway_of_the_real_tiny_model():
    transformer = build_preset("tiny", seed=0).transformer
    und = ("self_attn.to_q", "self_attn.to_k", "self_attn.to_v", "self_attn.to_out", "mlp.")
    counted = sum(
        p.numel() for n, p in transformer.layers.named_parameters()
        if n.endswith(".weight") and any(f".{k}" in n for k in und) and "moe_gen" not in n
    )  # fmt: skip
    assert counted == 73728
    lora.add_adapters(transformer, rank=8, alpha=16.0, names=["policy"])
    adapter = sum(t.numel() for t in lora.adapter_tensors(transformer, "policy").values())
    assert adapter == 2 * (90112 - 73728)  # the adapter covers both pathways; a token passes one


def test_attention_pairs_by_hand():
    assert mfu.cosmos3_attention_pairs([10], [4]) == 156
    assert mfu.cosmos3_attention_pairs([10, 10], [4, 4]) == 312
    # text-tower reuse: no text queries, the 4 vision rows still read 10 + 4 keys each
    assert mfu.cosmos3_attention_pairs([10], [4], text_reused=True) == 56
    with pytest.raises(ValueError):
        mfu.cosmos3_attention_pairs([10], [4, 4])


def test_forward_and_step_flops_by_hand():
    forward = mfu.forward_flops(params_per_token=73728, tokens=14, layers=2, attn_width=64, attention_pairs=156)
    assert forward == 2064384 + 79872 == 2144256
    assert mfu.step_flops(forward, no_grad_forwards=1, grad_forwards=1) == 8577024
    assert mfu.step_flops(forward, grad_forwards=1) == 3 * 2144256


def test_mfu_by_hand():
    assert mfu.mfu(989e12, 2.0, 989.0) == pytest.approx(0.5)
    assert mfu.mfu(1e12, 1.0, None) is None


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("cpu", None),
        (None, None),
    ],
)
def test_peak_table(name, tflops):
    assert mfu.peak_bf16_tflops(name) == tflops
