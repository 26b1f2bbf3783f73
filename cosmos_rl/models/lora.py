"""Named LoRA adapters on the Cosmos3 transformer (peft), and the few operations RL needs on them.

Several adapters share one network: e.g. "policy" (trained), "old" (a moving copy used for
rollouts) and, with adapters disabled, the base model as the reference. Facts of peft relied on:
adding an adapter makes it the active one, a fresh adapter's lora_B is zero (so it equals the
base), and activating an adapter makes it the only trainable one.

Switching runs every training step (the reference forward of DPO, NFT and GRPO; NFT's old and
policy forwards), so it is done on the tuner layers themselves, found once per set of adapter
names. diffusers' model-level `disable_adapters`/`enable_adapters`/`set_adapter` read the installed
peft version from package metadata, walk every module and set requires_grad parameter by parameter
on each call: 4 to 8 ms of CPU per reference switch on the tiny preset, against about 0.1 ms here
(`bench/dpo_bench.py` prints both). Two more facts of peft are relied on for that: a tuner layer's
forward obeys its `disable_adapters` and `active_adapter` properties, which read the layer's
`_disable_adapters` and `_active_adapter` attributes (tests/test_models_lora.py fails if not).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import torch
from peft import LoraConfig
from peft.tuners.lora import LoraLayer
from peft.tuners.tuners_utils import BaseTunerLayer

from cosmos_rl.models.towers import DEFAULT_TARGET_MODULES, peft_targets  # noqa: F401  (DEFAULT_TARGET_MODULES is this module's name too)



def add_adapters(
    transformer: torch.nn.Module,
    rank: int,
    alpha: float,
    names: list[str],
    target_modules: list[str] | None = None,
) -> None:
    """Add one LoRA adapter per name (all equal to the base at first); the first name ends up active.

    `target_modules`: module names (peft's suffix match) and/or tower names (`models/towers.TOWERS`,
    matched by full module path); None or empty = `DEFAULT_TARGET_MODULES`."""
    if not names:
        raise ValueError("add_adapters needs at least one adapter name")
    if len(set(names)) != len(names):
        raise ValueError(f"adapter names must be distinct, got {names}")
    requested = list(target_modules or DEFAULT_TARGET_MODULES)
    _check_targets_match(transformer, requested)
    targets = peft_targets(requested)
    for name in names:
        config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=True)
        with warnings.catch_warnings():
            # Several adapters on one model is the point here, not an accident.
            warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
            transformer.add_adapter(config, adapter_name=name)
    set_active(transformer, names[0])


def _check_targets_match(transformer: torch.nn.Module, requested: list[str]) -> None:
    # peft only fails when nothing matches; an entry that matches nothing among others would adapt
    # less than the manifest says, silently.
    from cosmos_rl.core.errors import UserError
    from cosmos_rl.models.towers import TOWERS

    paths = [name for name, _ in transformer.named_modules() if name]
    for index, target in enumerate(requested):
        if target in TOWERS:
            continue
        if not any(path == target or path.endswith("." + target) for path in paths):
            raise UserError(
                f"model.lora.target_modules[{index}]: {target!r} names no module of this transformer; name a module "
                f"it has (e.g. to_q, add_q_proj, gate_proj) or a tower ({', '.join(TOWERS)})"
            )


# The walk over a transformer's tuner layers, kept in its instance dict as (its adapter names when the
# walk was made, the tuner layers with their paths). Adding or deleting an adapter changes the names
# and so the walk is made again; FSDP2 sharding and gradient checkpointing keep the layer objects and
# their paths. Not a module-level WeakKeyDictionary keyed by the transformer: after a sharded forward
# every layer reaches the root through FSDP2's shared state, so the value would keep its own key alive
# and no model would ever be freed (a second Nano-sized model in one process ran out of GPU memory).
_TUNER_LAYERS_ATTRIBUTE = "_cosmos_rl_tuner_layers"


def tuner_layers(transformer: torch.nn.Module) -> list[tuple[str, BaseTunerLayer]]:
    """(module path, peft tuner layer) of every adapted module, walked once per set of adapter names."""
    names = tuple(getattr(transformer, "peft_config", None) or ())
    held = transformer.__dict__.get(_TUNER_LAYERS_ATTRIBUTE)
    if held is None or held[0] != names:
        found = [(path, module) for path, module in transformer.named_modules() if isinstance(module, BaseTunerLayer)]
        # In the instance dict: a plain attribute, never a submodule, buffer or state-dict entry.
        held = transformer.__dict__[_TUNER_LAYERS_ATTRIBUTE] = (names, found)
    return held[1]


def _lora_layers(transformer: torch.nn.Module) -> Iterator[tuple[str, LoraLayer]]:
    for module_name, module in tuner_layers(transformer):
        if isinstance(module, LoraLayer):
            yield module_name, module


def _check_known(transformer: torch.nn.Module, *names: str) -> None:
    known = set(getattr(transformer, "peft_config", {}) or {})
    for name in names:
        if name not in known:
            raise ValueError(f"no LoRA adapter named {name!r}; this transformer has {sorted(known)}")


def set_active(transformer: torch.nn.Module, name: str) -> None:
    """Make `name` the adapter used in forwards and the only trainable one (what diffusers'
    `set_adapter` does: peft's per-layer `set_adapter` on every tuner layer)."""
    _check_known(transformer, name)
    for _, layer in tuner_layers(transformer):
        layer.set_adapter([name])


def use_adapter(transformer: torch.nn.Module, name: str) -> None:
    """Make `name` the adapter used in forwards, leaving every requires_grad flag as it is (e.g. the
    old policy runs while the policy stays the only trainable adapter). Only each tuner layer's
    active adapter (what peft's `active_adapter` property reads) is set; `set_active` also flips
    the flags, parameter by parameter."""
    _check_known(transformer, name)
    for _, layer in tuner_layers(transformer):
        layer._active_adapter = [name]


@contextmanager
def adapters_disabled(transformer: torch.nn.Module) -> Iterator[None]:
    """Run the base model (the frozen reference) inside the block; the adapters' state comes back after.

    Only each tuner layer's disabled flag (what peft's `disable_adapters` property reads, and its
    forward obeys) is set, then put back as it was: the active adapter and every requires_grad flag
    stay as they are, inside the block and after it. (diffusers' `disable_adapters` also clears
    requires_grad on every adapter, and its `enable_adapters` makes the active adapter trainable;
    FSDP2 fixes a layer's gradient dtypes at its first forward from the trainable parameters it
    sees: seeing none, as DPO's first forward is the reference's, it would reduce bf16 gradients in
    bf16 and fail to store them on the fp32 master weights.) Nested blocks on one network restore
    the disabled state of the outer block.
    """
    layers = [layer for _, layer in tuner_layers(transformer)]
    if not layers:
        raise ValueError("adapters_disabled: this transformer has no LoRA adapter")
    were = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, was in zip(layers, were):
            layer._disable_adapters = was


def _adapter_params(transformer: torch.nn.Module, name: str) -> dict[str, torch.nn.Parameter]:
    params = {}
    for module_name, layer in _lora_layers(transformer):
        for kind in ("lora_A", "lora_B"):
            block = getattr(layer, kind)
            if name in block:
                for param_name, param in block[name].named_parameters():
                    params[f"{module_name}.{kind}.{param_name}"] = param
    return params


def adapter_tensors(transformer: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """The adapter's live parameters keyed without the adapter name ("layers.0.self_attn.to_q.lora_A.weight").

    Keys are the same for every adapter, so two adapters can be compared key by key. The values are
    the parameters themselves (DTensors when sharded), not copies: clone to keep a snapshot.
    """
    _check_known(transformer, name)
    return dict(_adapter_params(transformer, name))


@torch.no_grad()
def copy_adapter(transformer: torch.nn.Module, src: str, dst: str) -> None:
    """dst <- src, in place (e.g. start "old" equal to "policy")."""
    blend_adapter(transformer, dst, src, keep=0.0)


@torch.no_grad()
def blend_adapter(transformer: torch.nn.Module, dst: str, src: str, keep: float) -> None:
    """dst <- keep * dst + (1 - keep) * src for every LoRA tensor, in place (an EMA step when 0 < keep < 1)."""
    _check_known(transformer, dst, src)
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must be in [0, 1], got {keep}")
    dst_params, src_params = _adapter_params(transformer, dst), _adapter_params(transformer, src)
    if dst_params.keys() != src_params.keys():
        raise ValueError(f"adapters {dst!r} and {src!r} target different modules")
    for key, dst_param in dst_params.items():
        if keep == 0.0:
            dst_param.copy_(src_params[key])
        else:
            dst_param.mul_(keep).add_(src_params[key], alpha=1.0 - keep)


@torch.no_grad()
def merged_state_dict(transformer: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """The plain (adapter-free) transformer's state dict with adapter `name` folded into its weights:
    W + scaling * B @ A for every adapted layer (peft's own delta), the network left untouched."""
    _check_known(transformer, name)
    deltas = {f"{module_name}.base_layer.weight": layer.get_delta_weight(name) for module_name, layer in _lora_layers(transformer)}
    merged = {}
    for key, value in transformer.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        merged[plain] = value + deltas[key].to(value.dtype) if key in deltas else value.clone()
    return merged
