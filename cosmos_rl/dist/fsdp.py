"""FSDP2 sharding of the Cosmos3 transformer: one unit per decoder layer, then the root."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def quiet_view_output_warning() -> None:
    """Silence FSDP2's per-forward "returned a view tensor" warning in this process.

    packing.velocity only reads a slice of the root's output and never edits it in place, which is
    the only case the warning is about; printed every step, it would bury real warnings.
    """
    import warnings

    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def _cast_to_weight_dtype(module: torch.nn.Module, args: tuple) -> tuple:
    weight_dtype = next(module.parameters()).dtype
    return tuple(a.to(weight_dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def shard_transformer(
    transformer: torch.nn.Module,
    *,
    mixed_precision: bool,
    mesh: DeviceMesh | None = None,
) -> torch.nn.Module:
    """Shard `transformer` in place over the default process group (or `mesh`) and return it.

    Add LoRA adapters before sharding. With `mixed_precision`, parameters are gathered and used
    in bf16 while gradients are reduced in fp32 (the sharded master weights keep their dtype).
    """
    from cosmos_rl.dist.world import process_group_active

    if not process_group_active():
        raise RuntimeError(
            "shard_transformer needs an initialised torch.distributed process group; "
            "call torch.distributed.init_process_group first (e.g. under torchrun)"
        )
    if not hasattr(transformer, "layers"):
        raise TypeError(f"expected a Cosmos3 transformer with .layers, got {type(transformer).__name__}")

    layer_policy = root_policy = MixedPrecisionPolicy()
    if mixed_precision:
        layer_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # The root's float inputs stay fp32: bf16 would round the flow timesteps (~1000 * sigma)
        # to steps of 4. Only the latents need the compute dtype, so proj_in casts its own input.
        root_policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
        )
        transformer.proj_in.register_forward_pre_hook(_cast_to_weight_dtype)

    for layer in transformer.layers:
        fully_shard(layer, mesh=mesh, mp_policy=layer_policy)
    fully_shard(transformer, mesh=mesh, mp_policy=root_policy)
    return transformer


@contextmanager
def _kept_gathered(transformer: torch.nn.Module) -> Iterator[None]:
    # Each sharded layer keeps its gathered weights after its forwards and backwards inside the
    # block; every layer is resharded at exit. A no-op on an unsharded transformer.
    layers = [layer for layer in getattr(transformer, "layers", ()) if isinstance(layer, FSDPModule)]
    for layer in layers:
        layer.set_reshard_after_forward(False, recurse=False)
        layer.set_reshard_after_backward(False, recurse=False)
    try:
        yield
    finally:
        for layer in layers:
            layer.set_reshard_after_forward(True, recurse=False)
            layer.set_reshard_after_backward(True, recurse=False)
            layer.reshard()


@contextmanager
def gathered_while_sampling(transformer: torch.nn.Module) -> Iterator[None]:
    """Keep each sharded layer's all-gathered weights between the forwards of a no-grad sampling
    loop instead of gathering them again for every sampler step (the weights cannot change inside
    it, so the forwards are the same); every layer is resharded at exit, before any training.
    Costs one unsharded copy of the weights while it lasts. A no-op on an unsharded transformer."""
    with _kept_gathered(transformer):
        yield


@contextmanager
def gathered_while_training(transformer: torch.nn.Module) -> Iterator[None]:
    """Keep each sharded layer's all-gathered weights from its first forward in the block to the
    block's end: the forwards and backwards of one optimizer step (old, reference and policy
    forwards; several micro-batches) gather each layer once instead of once per forward and per
    backward. Gradients are still reduce-scattered after every backward, as without the block, so
    the step's numbers are unchanged. Every layer is resharded at exit, so the block must close
    before the optimizer step (which updates the shards the next gather reads). Costs one
    unsharded copy of the weights while it lasts. A no-op on an unsharded transformer."""
    with _kept_gathered(transformer):
        yield
