"""From a RunConfig and a device, build what a trainer needs: the trainable model, its frozen
reference, the optimizer.

Shared by the DPO and NFT trainers. API (both import it):

    model = build_trainable(config, device, adapter_names=("policy",))
    model.transformer            the trained network (LoRA-wrapped and/or FSDP2-sharded)
    model.parts                  ModelParts(transformer, vae, tokenizer, scheduler)
    model.vae, model.tokenizer   frozen VAE (requires_grad False) and tokenizer
    model.lora                   True when model.lora.rank > 0
    model.sharded                True when a process group was initialised and FSDP2 applied
    with model.reference() as ref:   the frozen reference network, for no-grad forwards
        v_ref = velocity(ref, ...)
    model.trainable_parameters() the parameters the optimizer owns
    model.state_module()         the module whose (trainable) state a checkpoint saves

    optimizer, schedule = build_optimizer(model.trainable_parameters(), config.rl.optimizer)

"policy" names one thing only: the trained LoRA adapter (or, for a full fine-tune, the trained
weights) and the checkpoint component holding it.

The architecture, VAE, tokenizer and scheduler come from the model the manifest names: model.path
(a local diffusers folder, built without its sound/action heads, except for video NFT, which
builds every head its checkpoint has: `builds_heads`) or model.preset. The transformer's weights
come from the base: `rl.init_from` when set (a diffusers
folder, weights folder, DCP folder or s3:// URL pulled once per node into
`<job.output_dir>/.cache/init_from`; `preset:NAME` = the preset's own seeded weights), else
model.path's own weights (or the preset's seeded weights). Every base is loaded strictly, dropping
only the keys `rl.init_keys_to_skip_loading` lists.

The reference is what the policy was at setup and never changes, so it is never checkpointed:
with LoRA it is the same network with adapters disabled (no copy); with full fine-tuning
(model.lora.rank = 0) it is a frozen copy of the base taken before any training.

Every rank builds bit-identical weights: presets draw from a private RNG seeded by job.seed and the
LoRA adapters are initialised under their own seed too, so ranks agree before FSDP2 shards.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch

from cosmos_rl.core import schema
from cosmos_rl.dist.world import process_group_active
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.condition import kind_named
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.models import lora, text_kv
from cosmos_rl.models.base_checkpoint import load_base_weights, resolve_init_from
from cosmos_rl.models.build import ModelParts, build_preset, load_parts
from cosmos_rl.models.layout import PRESET_SCHEME, init_cache_root, is_pipeline_folder
from cosmos_rl.models.lr_schedule import lr_factor

# LoRA's lora_A is drawn from torch's RNG; an offset keeps its stream apart from the preset's.
_LORA_SEED_OFFSET = 7919


@dataclass
class TrainableModel:
    """The trained network, its frozen parts and its frozen reference (see the module docstring)."""

    parts: ModelParts
    lora: bool
    adapter_names: tuple[str, ...]
    sharded: bool
    device: torch.device
    # Full fine-tune only: the frozen base copy. With LoRA the reference is the adapters-off network.
    frozen_ref: Optional[torch.nn.Module] = field(default=None, repr=False)

    @property
    def transformer(self) -> torch.nn.Module:
        return self.parts.transformer

    @property
    def vae(self):
        return self.parts.vae

    @property
    def tokenizer(self):
        return self.parts.tokenizer

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """Yield the frozen reference network; use it under torch.no_grad()."""
        if self.lora:
            with lora.adapters_disabled(self.transformer):
                yield self.transformer
        else:
            yield self.frozen_ref

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def state_module(self) -> torch.nn.Module:
        """What a checkpoint's policy component wraps: with LoRA only its trainable tensors are saved."""
        return self.transformer


def _init_cache_dir(config: schema.RunConfig) -> Path:
    return init_cache_root(config.job.output_dir)


def builds_heads(config: schema.RunConfig) -> bool:
    """Video NFT builds a folder's sound and action heads (present, unused), so that its empty
    rl.init_keys_to_skip_loading loads the whole base, and an action-mode run (the world model)
    builds them to use the action heads; every other run builds without them."""
    if kind_named(config.model.condition.kind).action_mode:
        return True
    return isinstance(config.rl, schema.NFTConfig) and MediaSpec.from_model_config(config.model).is_video


def load_base(config: schema.RunConfig) -> ModelParts:
    """The base model the manifest names (see the module docstring), on CPU, in eval mode.

    Preflight has already refused contradictions (a preset base with a folder model, a pipeline
    folder base that is not model.path); what is left is checked here only where preflight cannot
    see it: a pulled s3:// base that turns out to be a whole pipeline folder.
    """
    init_from, skip = config.rl.init_from, list(config.rl.init_keys_to_skip_loading)
    model = config.model
    if not model.path and model.preset is None:
        raise UserError("model.path: no model named; set model.path to a local diffusers folder, or model.preset")
    if not model.path:
        parts = build_preset(model.preset, config.job.seed)
        if init_from == "" or init_from.startswith(PRESET_SCHEME):
            return parts
        local = resolve_init_from(init_from, _init_cache_dir(config))
        if is_pipeline_folder(local):
            raise UserError(
                f"rl.init_from: {init_from} is a whole diffusers pipeline folder (model_index.json), which "
                f"brings its own architecture, VAE, tokenizer and scheduler, but the model is model.preset = "
                f"{model.preset!r}; set model.path to a local copy of that folder instead of model.preset"
            )
        load_base_weights(parts.transformer, local, skip, shown_as=init_from)
        return parts
    heads = builds_heads(config)
    if init_from == "":  # the folder's own weights
        return load_parts(model.path, skip_keys=skip, heads=heads)
    parts = load_parts(model.path, weights=False, heads=heads)
    local = resolve_init_from(init_from, _init_cache_dir(config))
    load_base_weights(parts.transformer, local, skip, shown_as=init_from)
    return parts


def _freeze(module: torch.nn.Module) -> torch.nn.Module:
    module.requires_grad_(False)
    module.eval()
    return module


def build_trainable(
    config: schema.RunConfig, device: torch.device, *, adapter_names: tuple[str, ...] = ("policy",),
    with_reference: bool = True,
) -> TrainableModel:
    """Build the trainable model on `device` (identical on every rank), sharded when a process group exists.

    `with_reference=False` (SFT, which has no reference) skips a full fine-tune's frozen copy;
    `reference()` then must not be used."""
    parts = load_base(config)
    _freeze(parts.vae)
    rank = config.model.lora.rank
    use_lora = rank > 0
    transformer = parts.transformer

    frozen_ref = None
    if use_lora:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.job.seed + _LORA_SEED_OFFSET)
            lora.add_adapters(
                transformer,
                rank,
                config.model.lora.alpha,
                list(adapter_names),
                list(config.model.lora.target_modules) or None,
            )
    else:
        frozen_ref = _freeze(copy.deepcopy(transformer)) if with_reference else None
        transformer.requires_grad_(True)
        # The text head is on no path an image loss reaches: it would never get a gradient, so
        # AdamW would hold no state for it and a checkpoint's optimizer state would miss it.
        if getattr(transformer, "lm_head", None) is not None:
            transformer.lm_head.requires_grad_(False)

    if config.model.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    # Dropout-free model, but train mode is what the optimizer step assumes (and checkpointing needs).
    transformer.train()

    parts.vae.to(device)
    transformer.to(device)
    if frozen_ref is not None:
        frozen_ref.to(device)

    sharded = process_group_active()
    if sharded:
        from cosmos_rl.dist.fsdp import shard_transformer

        mixed = config.model.dtype == "bfloat16"
        shard_transformer(transformer, mixed_precision=mixed)
        if frozen_ref is not None:
            shard_transformer(frozen_ref, mixed_precision=mixed)
    return TrainableModel(
        parts=parts,
        lora=use_lora,
        adapter_names=tuple(adapter_names) if use_lora else (),
        sharded=sharded,
        device=device,
        frozen_ref=frozen_ref,
    )


def build_optimizer(
    params: list[torch.nn.Parameter], cfg: schema.OptimizerConfig
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and its LR schedule (`lr_factor`; call schedule.step() after each optimizer step)."""
    params = list(params)
    if not params:
        raise UserError(
            "model.lora.target_modules: the model has no trainable parameters (the patterns match no module); "
            "name modules the transformer has, or leave the list empty for the defaults"
        )
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))
    return optimizer, schedule


def optimizer_step(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    grad_clip: float,
) -> tuple[torch.Tensor, float]:
    """Clip (grad_clip > 0) or just measure the gradient norm, then step the optimizer and the LR
    schedule, and end the step's text-tower reuse. Returns (the norm before clipping, the LR the step
    used); shared by every trainer."""
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
        norm = norm.full_tensor()
    lr = schedule.get_last_lr()[0]
    optimizer.step()
    schedule.step()
    # Held text-tower keys/values live for one optimizer step (models/text_kv.py).
    text_kv.new_step()
    return norm, lr
