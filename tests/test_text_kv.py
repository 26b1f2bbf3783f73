"""Text-tower reuse (models/text_kv.py) and LoRA targets by tower (models/towers.py).

Reuse is exact: every forward is compared against the same forward with reuse disabled (today's
path, which the packing tests tie to the stock pipeline), and training gradients against
gradients computed without reuse."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from _models_helpers import stock_pipeline

from cosmos_rl.core.errors import UserError
from cosmos_rl.models import text_kv
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.lora import adapters_disabled, add_adapters, set_active
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.sampling import sample_latents
from cosmos_rl.models.text import tokenize_prompts
from cosmos_rl.models.towers import adapts_text_tower, peft_targets

PROMPTS = ["a red cube", "a much longer prompt about a dog on a red sofa", "a blue sphere"]


def _counts(transformer) -> dict:
    return dict(text_kv.cache_of(transformer).counts)


def _lora_paths(transformer) -> set[str]:
    from peft.tuners.lora import LoraLayer

    return {name for name, module in transformer.named_modules() if isinstance(module, LoraLayer)}


def _batch(parts, rows=3):
    ids, _ = tokenize_prompts(parts.tokenizer, PROMPTS[:rows])
    x_t = torch.randn(rows, 4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    return x_t, torch.tensor([0.9, 0.5, 0.1][:rows]), ids


def test_a_cfg_rollout_runs_the_text_tower_once_and_equals_the_stock_pipeline():
    parts = build_preset("tiny", seed=0)
    cond, uncond = tokenize_prompts(parts.tokenizer, PROMPTS[:1], resolution=(32, 32))
    noise = torch.randn(1, 4, 1, 8, 8, generator=torch.Generator().manual_seed(11))
    got, _ = sample_latents(functools.partial(velocity, parts.transformer), noise, cond, uncond, 6, 3.0, 3.0)
    # 6 sampler steps of one packed cond+uncond forward: the first records, the other five reuse.
    assert _counts(parts.transformer) == {"record": 1, "reuse": 5}
    pipe = stock_pipeline(parts, shift=3.0)
    with torch.no_grad():
        expected = pipe(
            prompt=PROMPTS[0], num_frames=1, height=32, width=32, num_inference_steps=6,
            guidance_scale=3.0, latents=noise[0][None], output_type="latent",
        ).video  # fmt: skip
    assert (got - expected).abs().max() <= 2e-6


def test_reused_forwards_equal_forwards_that_run_the_text_tower():
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    x_t, sigma, ids = _batch(parts)
    with torch.no_grad():
        with text_kv.disabled(transformer):
            expected = velocity(transformer, x_t, sigma, ids)
            assert _counts(transformer) == {"record": 0, "reuse": 0}
        first = velocity(transformer, x_t, sigma, ids)
        again = velocity(transformer, x_t, sigma, ids)
        # a repeat of one prompt in another batch reads the same entry
        alone = velocity(transformer, x_t[1:2], sigma[1:2], ids[1:2])
    assert _counts(transformer) == {"record": 1, "reuse": 2}
    torch.testing.assert_close(first, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(again, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(alone, expected[1:2], atol=1e-6, rtol=0)


def test_a_text_tower_weight_changed_in_place_or_an_optimizer_step_drops_the_entries():
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    x_t, sigma, ids = _batch(parts)
    with torch.no_grad():
        velocity(transformer, x_t, sigma, ids)
        transformer.layers[0].mlp.up_proj.weight.mul_(1.5)  # the text MLP feeds layer 1's text keys
        after = velocity(transformer, x_t, sigma, ids)
        with text_kv.disabled(transformer):
            fresh = velocity(transformer, x_t, sigma, ids)
    assert _counts(transformer) == {"record": 2, "reuse": 0}
    torch.testing.assert_close(after, fresh, atol=1e-6, rtol=0)
    text_kv.new_step()
    assert not text_kv.cache_of(transformer).entries
    with torch.no_grad():
        velocity(transformer, x_t, sigma, ids)
    assert text_kv.cache_of(transformer).entries
    transformer.load_state_dict(transformer.state_dict())  # e.g. a checkpoint loaded into the model
    assert not text_kv.cache_of(transformer).entries


def _nft_like_step(transformer, x_t, sigma, ids, target):
    # old (no grad), reference (adapters off, no grad) and policy forwards, as trainers/nft.py makes them
    with torch.no_grad():
        set_active(transformer, "old")
        v_old = velocity(transformer, x_t, sigma, ids)
        set_active(transformer, "policy")
        with adapters_disabled(transformer):
            v_ref = velocity(transformer, x_t, sigma, ids)
    v = velocity(transformer, x_t, sigma, ids)
    loss = (v - target).square().mean() + (v - v_old).square().mean() + 0.1 * (v - v_ref).square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in transformer.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _generation_lora(checkpointing: bool):
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    torch.manual_seed(1)
    add_adapters(transformer, 4, 8.0, ["policy", "old"], ["generation", "generation_mlp"])
    with torch.no_grad():  # non-zero adapters, different for old and policy
        for name, param in transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    set_active(transformer, "policy")
    if checkpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    return parts, transformer


@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_losses_and_gradients_equal_todays_with_generation_adapters(checkpointing):
    parts, transformer = _generation_lora(checkpointing)
    x_t, sigma, ids = _batch(parts)
    target = torch.randn(x_t.shape, generator=torch.Generator().manual_seed(2))
    with text_kv.disabled(transformer):
        loss_off, grads_off = _nft_like_step(transformer, x_t, sigma, ids, target)
    transformer.zero_grad(set_to_none=True)
    loss_on, grads_on = _nft_like_step(transformer, x_t, sigma, ids, target)
    # the old forward records; the reference and the graph-building policy forward reuse
    assert _counts(transformer) == {"record": 1, "reuse": 2}
    assert grads_on.keys() == grads_off.keys() and grads_on and all("lora_" in n for n in grads_on)
    torch.testing.assert_close(loss_on, loss_off, atol=1e-6, rtol=0)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, atol=1e-6, rtol=0, msg=name)


def test_reuse_is_off_with_text_tower_adapters_and_for_a_full_fine_tunes_training_forwards():
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    x_t, sigma, ids = _batch(parts)
    # a full fine-tune: every weight requires grad, so a graph-building forward runs the text tower
    velocity(transformer, x_t, sigma, ids).sum().backward()
    assert transformer.layers[0].self_attn.to_k.weight.grad is not None
    assert _counts(transformer) == {"record": 0, "reuse": 0}
    add_adapters(transformer, 4, 8.0, ["policy"])  # the default targets adapt the text tower
    with torch.no_grad():
        velocity(transformer, x_t, sigma, ids)
        velocity(transformer, x_t, sigma, ids)
    assert _counts(transformer) == {"record": 0, "reuse": 0}


def _both_tower_lora():
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    torch.manual_seed(2)
    add_adapters(transformer, 4, 8.0, ["policy", "old"])  # the default targets: both towers
    with torch.no_grad():  # non-zero adapters, different for old and policy
        for name, param in transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    set_active(transformer, "policy")
    return parts, transformer


def test_a_sampling_loop_holds_the_text_tower_despite_its_adapters_and_equals_todays_bit_for_bit():
    """Inside held_while_sampling the first forward records and later sampler steps reuse, with
    LoRA layers on the text tower; the samples equal the loop with reuse off exactly (a GRPO or NFT
    rollout must not move), and nothing held inside outlives the block."""
    parts, transformer = _both_tower_lora()
    cond, uncond = tokenize_prompts(parts.tokenizer, PROMPTS, resolution=(32, 32))
    noise = torch.randn(3, 4, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    loop = functools.partial(sample_latents, functools.partial(velocity, transformer), noise, cond, uncond, 5, 3.0, 3.0)
    with text_kv.disabled(transformer):
        expected, _ = loop()
    with text_kv.held_while_sampling(transformer):
        got, _ = loop()
        assert text_kv.cache_of(transformer).entries
    assert _counts(transformer) == {"record": 1, "reuse": 4}
    assert torch.equal(got, expected)
    assert not text_kv.cache_of(transformer).entries
    _, again = loop()  # outside the block the everyday rule holds: adapters on the text tower, no reuse
    assert _counts(transformer) == {"record": 1, "reuse": 4}


def test_the_evaluator_samples_inside_the_block_and_its_images_equal_todays():
    """Evaluation (`[rl.eval]`, `cosmos-rl eval`) samples a LoRA model whose text tower carries
    adapters: its loop reuses, and its images equal the same pass with reuse off."""
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.models.sampler_settings import SamplerSettings

    parts, transformer = _both_tower_lora()
    evaluator = Evaluator(
        ["a red circle", "two blue squares"], 2, "shapes_strict", SamplerSettings(steps=3, shift=None, guidance=2.0),
        tokenizer=parts.tokenizer, vae=parts.vae, media=MediaSpec.image(32), latent_shape=(4, 1, 8, 8),
        device=torch.device("cpu"), model_parts=parts,
    )  # fmt: skip
    with text_kv.disabled(transformer):
        expected = evaluator.sample(transformer, evaluator.items)
    got = evaluator.sample(transformer, evaluator.items)
    counts = _counts(transformer)
    assert counts["record"] >= 1 and counts["reuse"] >= 2 * counts["record"]  # 3 sampler steps a batch
    assert not text_kv.cache_of(transformer).entries
    assert got.shape == expected.shape and np.array_equal(got, expected)


def test_inside_the_block_an_adapter_switch_drops_the_entries_and_a_graph_forward_runs_the_text_tower():
    parts, transformer = _both_tower_lora()
    x_t, sigma, ids = _batch(parts)
    with torch.no_grad():
        set_active(transformer, "old")
        with text_kv.disabled(transformer):
            old_expected = velocity(transformer, x_t, sigma, ids)
            with adapters_disabled(transformer):
                base_expected = velocity(transformer, x_t, sigma, ids)
        set_active(transformer, "policy")
    with text_kv.held_while_sampling(transformer):
        with torch.no_grad():
            velocity(transformer, x_t, sigma, ids)  # the policy's keys/values
            set_active(transformer, "old")
            old = velocity(transformer, x_t, sigma, ids)
            with adapters_disabled(transformer):
                base = velocity(transformer, x_t, sigma, ids)
        assert _counts(transformer) == {"record": 3, "reuse": 0}
        velocity(transformer, x_t, sigma, ids).sum().backward()  # builds a graph: today's forward
        assert _counts(transformer) == {"record": 3, "reuse": 0}
    assert torch.equal(old, old_expected) and torch.equal(base, base_expected)
    assert any(p.grad is not None for n, p in transformer.named_parameters() if "to_q.lora_B.old" in n)


def test_without_text_tower_adapters_the_block_changes_nothing():
    parts, transformer = _generation_lora(checkpointing=False)
    x_t, sigma, ids = _batch(parts)
    with torch.no_grad():
        with text_kv.held_while_sampling(transformer):
            velocity(transformer, x_t, sigma, ids)
        velocity(transformer, x_t, sigma, ids)  # entries recorded inside serve a forward after it
    assert _counts(transformer) == {"record": 1, "reuse": 1}


def test_tower_names_select_modules_by_full_path():
    parts = build_preset("tiny", seed=0)
    transformer = parts.transformer
    add_adapters(transformer, 2, 4.0, ["policy"], ["generation_mlp", "to_add_out"])
    layers = range(transformer.config.num_hidden_layers)
    expected = {f"layers.{i}.mlp_moe_gen.{leaf}" for i in layers for leaf in ("gate_proj", "up_proj", "down_proj")}
    expected |= {f"layers.{i}.self_attn.to_add_out" for i in layers}
    assert _lora_paths(transformer) == expected  # the text MLP's gate_proj is not hit

    parts = build_preset("tiny", seed=0)
    add_adapters(parts.transformer, 2, 4.0, ["policy"], ["understanding"])
    leaves = ("self_attn.to_q", "self_attn.to_k", "self_attn.to_v", "self_attn.to_out", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    assert _lora_paths(parts.transformer) == {f"layers.{i}.{leaf}" for i in layers for leaf in leaves}


def test_plain_names_match_as_before_and_one_matching_nothing_is_refused():
    assert peft_targets(["to_q", "to_v"]) == ["to_q", "to_v"]
    parts = build_preset("tiny", seed=0)
    with pytest.raises(UserError, match=r"model\.lora\.target_modules\[1\]: 'to_qq' names no module"):
        add_adapters(parts.transformer, 2, 4.0, ["policy"], ["to_q", "to_qq"])


def test_which_targets_adapt_the_text_tower():
    assert adapts_text_tower(["generation", "generation_mlp", "add_q_proj"]) == []
    assert adapts_text_tower(["understanding", "gate_proj", "to_k", "layers.3.self_attn.to_out"]) == [
        "understanding", "gate_proj", "to_k", "layers.3.self_attn.to_out",
    ]  # fmt: skip


def _manifest_problems(overrides: list[str]) -> dict[str, str]:
    from pathlib import Path

    from cosmos_rl.config import load

    manifest = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"
    _, problems = load.load_all_problems(manifest, overrides)
    return {p.path: p.render() for p in problems if p.severity == "error"}


@pytest.mark.parametrize(
    "targets, key, text",
    [
        ('["generation", "generaton"]', "model.lora.target_modules[1]", 'did you mean "generation"?'),
        ('["to q"]', "model.lora.target_modules[0]", "neither a tower name"),
        ('[""]', "model.lora.target_modules[0]", "an empty name"),
        ('["to_q", "to_q"]', "model.lora.target_modules", "names an entry twice"),
    ],
)
def test_preflight_judges_target_names(targets, key, text):
    problems = _manifest_problems([f"model.lora.target_modules={targets}"])
    assert key in problems and text in problems[key], problems


def test_tower_names_and_module_names_pass_preflight_and_plan_says_whether_reuse_is_on():
    from pathlib import Path

    from cosmos_rl.planning import plan
    from cosmos_rl.config import load

    assert _manifest_problems(['model.lora.target_modules=["generation", "generation_mlp", "to_q"]']) == {}
    manifest = Path(__file__).resolve().parents[1] / "manifests" / "nft_t2i_smoke.toml"
    lines = {
        targets: plan.build(load.load(manifest, [f"model.lora.target_modules={targets}"]))["text_tower_reuse"]
        for targets in ('["generation"]', '["generation", "gate_proj"]', "[]")
    }
    assert lines['["generation"]'].startswith("on:")
    assert lines['["generation", "gate_proj"]'].startswith("off in training forwards: model.lora.target_modules adapt the text tower (gate_proj)")
    assert lines["[]"].startswith("off in training forwards: the default model.lora.target_modules adapt the text tower (to_q,")
    assert "sampling loops (rollouts, evaluation) still reuse within each loop" in lines["[]"]
    full = plan.build(load.load(manifest, ["model.lora.rank=0", "rl.old.build_old=false"]))["text_tower_reuse"]
    assert full.startswith("off in training forwards: a full fine-tune")
