"""torchrun worker for tests/test_models_fsdp.py: one training step, FSDP2-sharded vs unsharded.

Every rank builds the same tiny model with LoRA, keeps an unsharded copy as the reference, shards
the other, and trains both one step on the same global batch (each rank feeds the sharded model
its half). Rank 0 writes the largest differences it saw to the JSON file named on the command line.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import weakref

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from cosmos_rl.dist.fsdp import gathered_while_sampling, gathered_while_training, shard_transformer
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.lora import adapter_tensors, adapters_disabled, add_adapters, blend_adapter, set_active
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.text import tokenize_prompts

PROMPTS = ["a cat", "a much longer prompt about a dog", "x", "a small red cube on a table"]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _max_diff(a: dict, b: dict) -> float:
    return max((_full(a[k]).float() - _full(b[k]).float()).abs().max().item() for k in a)


def _batch(tokenizer):
    generator = torch.Generator().manual_seed(11)
    x0 = torch.randn(4, 4, 1, 8, 8, generator=generator)
    noise = torch.randn(4, 4, 1, 8, 8, generator=generator)
    sigma = torch.tensor([0.9, 0.6, 0.3, 0.1])
    s = sigma.view(-1, 1, 1, 1)
    ids, _ = tokenize_prompts(tokenizer, PROMPTS)
    return (1 - s) * x0 + s * noise, sigma, ids, noise - x0


def _velocity_diff(a, b, x_t, sigma, ids) -> float:
    return (velocity(a, x_t, sigma, ids).float() - velocity(b, x_t, sigma, ids)).abs().max().item()


def _loss(transformer, x_t, sigma, ids, target):
    return (velocity(transformer, x_t, sigma, ids) - target).square().mean()


def one_step(mixed_precision: bool) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = build_preset("tiny", seed=0)
    sharded = parts.transformer
    add_adapters(sharded, rank=4, alpha=8, names=["policy", "old"])
    with torch.no_grad():  # identical non-zero adapters on every rank, so both lora_A and lora_B learn
        generator = torch.Generator().manual_seed(5)
        for name, param in sorted(sharded.named_parameters()):
            if "lora_" in name:
                param.normal_(0.0, 0.1, generator=generator)
    reference = copy.deepcopy(sharded)
    initial_policy = {k: v.clone() for k, v in adapter_tensors(reference, "policy").items()}
    shard_transformer(sharded, mixed_precision=mixed_precision)

    x_t, sigma, ids, target = _batch(parts.tokenizer)
    local = slice(rank * 4 // world, (rank + 1) * 4 // world)
    optimizers = [
        # Plain SGD: Adam's first step is sign(grad), which would magnify rounding in tiny gradients.
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        for model in (sharded, reference)
    ]
    _loss(sharded, x_t[local], sigma[local], ids[local], target[local]).backward()
    _loss(reference, x_t, sigma, ids, target).backward()
    grads = [
        {n: p.grad for n, p in model.named_parameters() if p.grad is not None} for model in (sharded, reference)
    ]
    for optimizer in optimizers:
        optimizer.step()

    result = {"grad_keys_match": grads[0].keys() == grads[1].keys(), "grad_diff": _max_diff(*grads)}
    result["grad_max"] = max(_full(g).abs().max().item() for g in grads[1].values())
    result["param_diff"] = _max_diff(dict(sharded.named_parameters()), dict(reference.named_parameters()))
    # The step must have moved the policy adapter, or the comparison above proves nothing.
    result["policy_moved"] = _max_diff(adapter_tensors(reference, "policy"), initial_policy)
    with torch.no_grad():
        result["forward_diff"] = _velocity_diff(sharded, reference, x_t, sigma, ids)
        with adapters_disabled(sharded), adapters_disabled(reference):
            result["base_forward_diff"] = _velocity_diff(sharded, reference, x_t, sigma, ids)
        blend_adapter(sharded, "old", "policy", keep=0.5)
        blend_adapter(reference, "old", "policy", keep=0.5)
        result["blend_diff"] = _max_diff(adapter_tensors(sharded, "old"), adapter_tensors(reference, "old"))
        result.update(_sampling_keeps_the_gathered_weights(sharded, x_t, sigma, ids))
    result.update(_training_keeps_the_gathered_weights(sharded, x_t, sigma, ids, target, local))
    return result


def _sampling_keeps_the_gathered_weights(sharded, x_t, sigma, ids) -> dict:
    """Inside gathered_while_sampling a layer's parameters stay the unsharded (plain) tensors after
    its forward instead of going back to DTensor shards; outside, they are shards again."""
    layer_params = lambda: [p for layer in sharded.layers for p in layer.parameters()]  # noqa: E731
    plain = [velocity(sharded, x_t, sigma, ids) for _ in range(2)]
    sharded_between = all(isinstance(p, DTensor) for p in layer_params())
    with gathered_while_sampling(sharded):
        kept = [velocity(sharded, x_t, sigma, ids) for _ in range(2)]
        gathered_between = not any(isinstance(p, DTensor) for p in layer_params())
    return {
        "sampling_diff": max((a - b).abs().max().item() for a, b in zip(plain, kept)),
        "sharded_between_plain_forwards": sharded_between, "gathered_between_kept_forwards": gathered_between,
        "resharded_after": all(isinstance(p, DTensor) for p in layer_params()),
    }


def _training_keeps_the_gathered_weights(sharded, x_t, sigma, ids, target, local) -> dict:
    """Two backwards (one per local row, as an online step trains micro-batches), each after a
    no-grad forward with the adapters off (the reference forward of DPO and NFT), inside
    gathered_while_training give exactly the gradients they give without it; each layer stays
    gathered from the first forward to the block's end and is a shard again after it."""
    layer_params = lambda: [p for layer in sharded.layers for p in layer.parameters()]  # noqa: E731
    rows = range(local.start, local.stop)
    gathered = []

    def two_backwards():
        for param in sharded.parameters():
            param.grad = None
        for row in rows:
            one = slice(row, row + 1)
            with torch.no_grad(), adapters_disabled(sharded):
                reference_loss = _loss(sharded, x_t[one], sigma[one], ids[one], target[one])
            (_loss(sharded, x_t[one], sigma[one], ids[one], target[one]) - reference_loss).backward()
            gathered.append(not any(isinstance(p, DTensor) for p in layer_params()))

    two_backwards()
    plain = {n: _full(p.grad).clone() for n, p in sharded.named_parameters() if p.grad is not None}
    plain_gathered, gathered[:] = list(gathered), []
    with gathered_while_training(sharded):
        two_backwards()
    kept = {n: _full(p.grad).clone() for n, p in sharded.named_parameters() if p.grad is not None}
    for param in sharded.parameters():
        param.grad = None
    return {
        "training_grad_keys_match": plain.keys() == kept.keys() and len(plain) > 0,
        "training_grad_diff": _max_diff(plain, kept), "training_grad_max": max(g.abs().max().item() for g in plain.values()),
        "sharded_between_plain_backwards": not any(plain_gathered), "gathered_between_kept_backwards": all(gathered),
        "resharded_after_training": all(isinstance(p, DTensor) for p in layer_params()),
    }  # fmt: skip


def generation_reuse_step() -> dict:
    """Adapters on the generation tower only, FSDP2 fp32: a no-grad forward holds the text tower's
    keys/values, the graph-building forward reuses them, and the gradients equal the unsharded
    model's computed without reuse; so does a sampling forward inside gathered_while_sampling."""
    from cosmos_rl.models import text_kv

    rank, world = dist.get_rank(), dist.get_world_size()
    parts = build_preset("tiny", seed=0)
    sharded = parts.transformer
    add_adapters(sharded, rank=4, alpha=8, names=["policy"], target_modules=["generation", "generation_mlp"])
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        for name, param in sorted(sharded.named_parameters()):
            if "lora_" in name:
                param.normal_(0.0, 0.1, generator=generator)
    reference = copy.deepcopy(sharded)
    shard_transformer(sharded, mixed_precision=False)
    x_t, sigma, ids, target = _batch(parts.tokenizer)
    local = slice(rank * 4 // world, (rank + 1) * 4 // world)
    with torch.no_grad():
        held = velocity(sharded, x_t[local], sigma[local], ids[local])  # records
    _loss(sharded, x_t[local], sigma[local], ids[local], target[local]).backward()  # reuses
    with text_kv.disabled(reference):
        with torch.no_grad():
            expected = velocity(reference, x_t[local], sigma[local], ids[local])
        _loss(reference, x_t, sigma, ids, target).backward()
    grads = [{n: p.grad for n, p in model.named_parameters() if p.grad is not None} for model in (sharded, reference)]
    with torch.no_grad(), gathered_while_sampling(sharded):
        sampled = velocity(sharded, x_t[local], sigma[local], ids[local])  # reuses
    return {
        "counts": dict(text_kv.cache_of(sharded).counts), "grad_keys_match": grads[0].keys() == grads[1].keys() and bool(grads[0]),
        "grad_diff": _max_diff(*grads), "grad_max": max(_full(g).abs().max().item() for g in grads[1].values()),
        "forward_diff": (held - expected).abs().max().item(),
        "sampling_diff": (sampled - expected).abs().max().item(),
    }  # fmt: skip


def freed_after_use() -> bool:
    """A sharded LoRA model that has run a forward and switched adapters is freed once dropped."""
    parts = build_preset("tiny", seed=0)
    add_adapters(parts.transformer, rank=4, alpha=8, names=["policy", "old"])
    shard_transformer(parts.transformer, mixed_precision=False)
    set_active(parts.transformer, "old")  # the walk over its tuner layers is made and kept
    x_t, sigma, ids, _ = _batch(parts.tokenizer)
    with torch.no_grad():
        velocity(parts.transformer, x_t, sigma, ids)  # FSDP2's lazy init links every layer to the root
    held = weakref.ref(parts.transformer)
    del parts
    gc.collect()
    return held() is None


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    try:
        results = {"fp32": one_step(False), "bf16": one_step(True), "generation_reuse": generation_reuse_step(),
                   "freed_after_use": freed_after_use()}
        if dist.get_rank() == 0:
            with open(out_path, "w") as handle:
                json.dump(results, handle)
    finally:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    # A normal interpreter exit after gloo work sometimes aborts (docs/topology.md, "Platform traps"); leave directly.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
