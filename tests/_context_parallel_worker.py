"""torchrun worker for tests/test_context_parallel.py: context-parallel forwards and backwards
against the one-rank computation, on a group of 4 ranks and on two groups of 2 (one world).

Every rank builds the same tiny model (with action heads) and the same batches. For each case it
computes the velocities and parameter gradients of a fixed weighted sum of them without context
parallelism (the reference), then again with its group's context parallelism; the parameter
gradients of the group are averaged (the convention of dist/context_parallel.py). Rank 0 writes
every rank's largest differences to the JSON file named on the command line.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist

from cosmos_rl.dist.context_parallel import context_parallel_group
from cosmos_rl.models.actions import ActionLayout
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.packing import set_context_parallel, velocity

CHANNELS, SIDE, PATCH = 4, 8, 2  # the tiny preset's latents: 8x8 cells, patch 2 -> 16 tokens a frame


def _batch(case: str, vocab: int, seed: int = 7):
    # Two samples with prompts of different lengths (two attention segments), 3 latent frames:
    # 48 vision tokens a sample; the action case adds 4 rows (52), every count divides by 4.
    generator = torch.Generator().manual_seed(seed)
    x_t = torch.randn(2, CHANNELS, 3, SIDE, SIDE, generator=generator)
    sigma = torch.tensor([0.8, 0.35])
    ids = [torch.randint(0, vocab, (5,), generator=generator), torch.randint(0, vocab, (9,), generator=generator)]
    kwargs = {}
    if case == "i2v":
        kwargs["clean_frames"] = 1  # core/condition first_frame: latent frame 0 given clean
    if case == "action":
        # core/condition policy: frame 0 given, the frames and 4 action rows generated; the two
        # samples are different embodiments (domain, width).
        layout = ActionLayout(rows=4, domain_ids=(1, 3), widths=(2, 6), clean_rows=(0, 0))
        actions = torch.randn(2, 4, 6, generator=generator)
        actions[0, :, 2:] = 0
        kwargs.update(clean_frames=1, actions=actions, action_layout=layout)
    if case == "odd":
        # One sample of 1 frame + 1 action row: 17 tokens, which no group of 2 or 4 splits.
        x_t, sigma, ids = x_t[:1, :, :1], sigma[:1], ids[:1]
        kwargs.update(actions=torch.randn(1, 1, 6, generator=generator), action_layout=ActionLayout(1, (0,), (6,), (0,)))
    return x_t, sigma, ids, kwargs


def _loss(transformer, case: str, vocab: int, seed: int = 7):
    out = velocity(transformer, *_batch(case, vocab, seed)[:3], **_batch(case, vocab, seed)[3])
    outputs = out if isinstance(out, tuple) else (out,)
    weights = torch.Generator().manual_seed(seed + 1)
    # A fixed weighting, so every output element has its own cotangent; a mean, as the training
    # losses are (a sum makes gradients of ~40 here, whose float32 rounding alone is ~4e-6).
    return sum((o * torch.randn(o.shape, generator=weights)).mean() for o in outputs), outputs


def _forward_backward(transformer, case: str, vocab: int):
    transformer.zero_grad(set_to_none=True)
    loss, outputs = _loss(transformer, case, vocab)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in transformer.named_parameters() if p.grad is not None}
    return [o.detach().clone() for o in outputs], grads


def _compare(transformer, cp, case: str, vocab: int, seen: list) -> dict:
    set_context_parallel(transformer, None)
    ref_out, ref_grads = _forward_backward(transformer, case, vocab)
    set_context_parallel(transformer, cp)
    seen.clear()
    out, grads = _forward_backward(transformer, case, vocab)
    set_context_parallel(transformer, None)
    for grad in grads.values():  # the group mean
        dist.all_reduce(grad, group=cp.group)
        grad /= cp.size
    return dict(
        velocity_diff=max((a - b).abs().max().item() for a, b in zip(out, ref_out)),
        velocity_max=max(a.abs().max().item() for a in ref_out),
        grad_keys_match=sorted(grads) == sorted(ref_grads),
        grad_diff=max((grads[k] - ref_grads[k]).abs().max().item() for k in ref_grads),
        grad_max=max(g.abs().max().item() for g in ref_grads.values()),
        cp_grad_max=max(g.abs().max().item() for g in grads.values()),
        grad_count=len(ref_grads),
        # vision/action rows the first decoder layer got on this rank (the whole batch: 2 samples)
        local_rows=seen[0],
        outputs=len(out),
    )


def _data_context_step(transformer, vocab: int) -> dict:
    """2 data-parallel x 2 context-parallel ranks, FSDP2 over the world: each context group trains
    its own action batch; the gradients must be those of one process on the mean of both losses."""
    from torch.distributed.tensor import DTensor

    from cosmos_rl.dist.context_parallel import data_context_layout
    from cosmos_rl.dist.fsdp import shard_transformer

    seeds = (7, 8)  # data-parallel rank d trains batch seeds[d]
    reference = copy.deepcopy(transformer)
    reference.zero_grad(set_to_none=True)
    (sum(_loss(reference, "action", vocab, seed)[0] for seed in seeds) / len(seeds)).backward()
    expected = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}

    layout = data_context_layout(2)
    sharded = copy.deepcopy(transformer)
    sharded.zero_grad(set_to_none=True)
    set_context_parallel(sharded, layout.cp)
    shard_transformer(sharded, mixed_precision=False)
    _loss(sharded, "action", vocab, seeds[layout.dp_rank])[0].backward()
    got = {}
    for name, p in sharded.named_parameters():
        if p.grad is not None:
            got[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
    return dict(
        dp_rank=layout.dp_rank,
        cp_rank=layout.cp.rank,
        grad_keys_match=sorted(got) == sorted(expected),
        grad_diff=max((got[k] - expected[k]).abs().max().item() for k in expected),
        grad_max=max(g.abs().max().item() for g in expected.values()),
    )


def main(path: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    parts = build_preset("tiny", seed=0, with_extra_heads=True)
    transformer = parts.transformer
    transformer.train()
    vocab = int(transformer.config.vocab_size)
    seen: list[int] = []
    transformer.layers[0].register_forward_pre_hook(lambda module, args: seen.append(int(args[1].shape[0])))

    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    groups = {4: context_parallel_group(None), 2: context_parallel_group(pairs[rank // 2])}
    results: dict = {}
    for size, cp in groups.items():
        for case in ("t2v", "i2v", "action"):
            results[f"{case}/{size}"] = _compare(transformer, cp, case, vocab, seen)
        transformer.enable_gradient_checkpointing()  # recompute runs the collectives again in backward
        results[f"action_checkpointed/{size}"] = _compare(transformer, cp, "action", vocab, seen)
        transformer.disable_gradient_checkpointing()
        set_context_parallel(transformer, cp)
        x_t, sigma, ids, kwargs = _batch("odd", vocab)
        try:
            velocity(transformer, x_t, sigma, ids, **kwargs)
            results[f"odd/{size}"] = "no error"
        except ValueError as error:
            results[f"odd/{size}"] = str(error)
        # A rank fed another batch than its group (here: its own sigma) is refused on every rank.
        x_t, sigma, ids, kwargs = _batch("t2v", vocab)
        try:
            velocity(transformer, x_t, sigma + 0.01 * cp.rank, ids, **kwargs)
            results[f"mismatch/{size}"] = "no error"
        except ValueError as error:
            results[f"mismatch/{size}"] = str(error)
        set_context_parallel(transformer, None)

    results["fsdp_dp2_cp2"] = _data_context_step(parts.transformer, vocab)

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, results)
    if rank == 0:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(everyone, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
