"""Named LoRA adapters: which one runs, which one trains, and in-place copy/blend."""

from __future__ import annotations

import pytest
import torch

from cosmos_rl.models.build import build_preset
from cosmos_rl.models.lora import (
    DEFAULT_TARGET_MODULES,
    adapter_tensors,
    adapters_disabled,
    add_adapters,
    blend_adapter,
    copy_adapter,
    set_active,
    use_adapter,
)
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.text import tokenize_prompts
from peft.tuners.tuners_utils import BaseTunerLayer


@pytest.fixture
def setup():
    parts = build_preset("tiny", seed=0)
    ids, _ = tokenize_prompts(parts.tokenizer, ["a cat", "a dog on a sofa"])
    x_t = torch.randn(2, 4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7, 0.3])
    transformer = parts.transformer
    with torch.no_grad():
        base = velocity(transformer, x_t, sigma, ids)
    add_adapters(transformer, rank=4, alpha=8, names=["policy", "old"])

    def run():
        with torch.no_grad():
            return velocity(transformer, x_t, sigma, ids)

    return transformer, run, base


def _perturb(transformer, name, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in adapter_tensors(transformer, name).values():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.1)


def _trainable(transformer):
    return {n for n, p in transformer.named_parameters() if p.requires_grad}


def test_fresh_adapters_equal_the_base_and_the_first_name_is_active(setup):
    transformer, run, base = setup
    assert transformer.active_adapters() == ["policy"]
    torch.testing.assert_close(run(), base, atol=0, rtol=0)


def test_default_targets_cover_every_projection_of_every_layer(setup):
    transformer, _, _ = setup
    tensors = adapter_tensors(transformer, "policy")
    per_layer = len(DEFAULT_TARGET_MODULES) + 3  # gate/up/down exist in both MLPs of a layer
    assert len(tensors) == 2 * per_layer * len(transformer.layers)  # lora_A and lora_B each
    assert "layers.0.self_attn.to_q.lora_A.weight" in tensors
    assert "layers.1.mlp_moe_gen.down_proj.lora_B.weight" in tensors


def test_only_the_active_adapter_trains_and_the_base_is_frozen(setup):
    transformer, _, _ = setup
    policy = {n for n, _ in transformer.named_parameters() if ".policy." in n}
    old = {n for n, _ in transformer.named_parameters() if ".old." in n}
    assert _trainable(transformer) == policy
    set_active(transformer, "old")
    assert _trainable(transformer) == old


def test_set_active_switches_which_adapter_runs(setup):
    transformer, run, base = setup
    _perturb(transformer, "old", seed=1)
    torch.testing.assert_close(run(), base, atol=0, rtol=0)  # "policy" is still zero
    set_active(transformer, "old")
    assert (run() - base).abs().max() > 1e-4


def test_adapters_disabled_runs_the_base_then_restores(setup):
    transformer, run, base = setup
    _perturb(transformer, "policy", seed=2)
    with_policy = run()
    assert (with_policy - base).abs().max() > 1e-4
    with adapters_disabled(transformer):
        torch.testing.assert_close(run(), base, atol=0, rtol=0)
    torch.testing.assert_close(run(), with_policy, atol=0, rtol=0)


def test_adapters_disabled_restores_even_after_an_error(setup):
    transformer, run, base = setup
    _perturb(transformer, "policy", seed=2)
    with_policy = run()
    with pytest.raises(RuntimeError):
        with adapters_disabled(transformer):
            raise RuntimeError("boom")
    torch.testing.assert_close(run(), with_policy, atol=0, rtol=0)


def _flags(transformer):
    return {n: p.requires_grad for n, p in transformer.named_parameters()}


def _tuner_layers(transformer):
    return [m for m in transformer.modules() if isinstance(m, BaseTunerLayer)]


def test_adapters_disabled_keeps_the_active_adapter_and_every_trainable_flag(setup):
    """"old" runs while "policy" trains (NFT's old forward): inside the block every layer is
    disabled and no flag moves (FSDP2 plans gradient dtypes from the flags at a first forward);
    after it "old" runs again, with the same flags."""
    transformer, run, base = setup
    _perturb(transformer, "old", seed=8)
    use_adapter(transformer, "old")
    with_old, before = run(), _flags(transformer)
    assert {n for n, f in before.items() if f} == {n for n in before if ".policy." in n}
    with adapters_disabled(transformer):
        assert all(layer.disable_adapters for layer in _tuner_layers(transformer))
        assert _flags(transformer) == before
        torch.testing.assert_close(run(), base, atol=0, rtol=0)
    assert not any(layer.disable_adapters for layer in _tuner_layers(transformer))
    assert transformer.active_adapters() == ["old"]
    assert _flags(transformer) == before
    torch.testing.assert_close(run(), with_old, atol=0, rtol=0)


def test_nested_adapters_disabled_stays_disabled_until_the_outer_block_ends(setup):
    transformer, run, base = setup
    _perturb(transformer, "policy", seed=9)
    with adapters_disabled(transformer):
        with adapters_disabled(transformer):
            pass
        torch.testing.assert_close(run(), base, atol=0, rtol=0)
    assert (run() - base).abs().max() > 1e-4


def test_use_adapter_runs_like_set_active_and_moves_no_flag(setup):
    transformer, run, _ = setup
    _perturb(transformer, "policy", seed=10)
    _perturb(transformer, "old", seed=11)
    before = _flags(transformer)
    use_adapter(transformer, "old")
    with_old = run()
    assert transformer.active_adapters() == ["old"] and _flags(transformer) == before
    set_active(transformer, "old")
    torch.testing.assert_close(run(), with_old, atol=0, rtol=0)
    with pytest.raises(ValueError, match="'ema'"):
        use_adapter(transformer, "ema")


def test_switching_sees_an_adapter_added_after_a_switch():
    """The tuner layers are found once per set of adapter names: an adapter added on other modules
    later brings new layers, which switching must reach too."""
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    ids, _ = tokenize_prompts(parts.tokenizer, ["a cat"])
    x_t, sigma = torch.randn(1, 4, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0.5])

    def run():
        with torch.no_grad():
            return velocity(transformer, x_t, sigma, ids)

    base = run()
    add_adapters(transformer, rank=4, alpha=8, names=["policy"], target_modules=["to_q"])
    with adapters_disabled(transformer):  # a first switch, before the second adapter exists
        pass
    add_adapters(transformer, rank=4, alpha=8, names=["gen"], target_modules=["add_q_proj"])
    _perturb(transformer, "gen", seed=12)
    assert all(".add_q_proj." in key for key in adapter_tensors(transformer, "gen"))
    assert (run() - base).abs().max() > 1e-4  # "gen" is active (add_adapters' first name)
    with adapters_disabled(transformer):
        torch.testing.assert_close(run(), base, atol=0, rtol=0)
    use_adapter(transformer, "policy")  # "policy" is still zero: the base again
    torch.testing.assert_close(run(), base, atol=0, rtol=0)


def test_copy_adapter_makes_dst_compute_like_src(setup):
    transformer, run, _ = setup
    _perturb(transformer, "policy", seed=3)
    _perturb(transformer, "old", seed=4)
    with_policy = run()
    copy_adapter(transformer, "policy", "old")
    policy, old = adapter_tensors(transformer, "policy"), adapter_tensors(transformer, "old")
    assert policy.keys() == old.keys()
    assert all(torch.equal(policy[k], old[k]) and policy[k] is not old[k] for k in policy)
    set_active(transformer, "old")
    torch.testing.assert_close(run(), with_policy, atol=0, rtol=0)


def test_blend_adapter_is_an_in_place_weighted_average(setup):
    transformer, _, _ = setup
    _perturb(transformer, "policy", seed=5)
    _perturb(transformer, "old", seed=6)
    before_old = {k: v.clone() for k, v in adapter_tensors(transformer, "old").items()}
    before_policy = {k: v.clone() for k, v in adapter_tensors(transformer, "policy").items()}
    live_old = adapter_tensors(transformer, "old")
    blend_adapter(transformer, "old", "policy", keep=0.25)
    for key, value in adapter_tensors(transformer, "old").items():
        torch.testing.assert_close(value, 0.25 * before_old[key] + 0.75 * before_policy[key])
        assert value is live_old[key]  # the same tensor, updated in place
    for key, value in adapter_tensors(transformer, "policy").items():
        assert torch.equal(value, before_policy[key])


def test_blend_with_keep_one_changes_nothing(setup):
    transformer, _, _ = setup
    _perturb(transformer, "policy", seed=7)
    before = {k: v.clone() for k, v in adapter_tensors(transformer, "old").items()}
    blend_adapter(transformer, "old", "policy", keep=1.0)
    assert all(torch.equal(v, before[k]) for k, v in adapter_tensors(transformer, "old").items())


def test_unknown_adapter_and_bad_keep_are_rejected(setup):
    transformer, _, _ = setup
    with pytest.raises(ValueError, match="'ema'"):
        set_active(transformer, "ema")
    with pytest.raises(ValueError, match="'ema'"):
        adapter_tensors(transformer, "ema")
    with pytest.raises(ValueError, match="keep"):
        blend_adapter(transformer, "old", "policy", keep=1.5)
