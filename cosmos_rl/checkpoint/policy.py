"""The trained weights as a checkpoint component: one format for every trainer and every reader.

A LoRA run saves an adapter's own tensors (``AdapterState``), keyed by their parameter names in
the network, which name the adapter (peft's: ``layers.0.self_attn.to_q.lora_A.policy.weight``):
the ``policy`` component holds adapter ``policy`` (DPO, SFT, NFT), NFT's ``old`` component adapter
``old``, GRPO's ``ema`` component (with rl.ema_decay) adapter ``ema``. A full fine-tune (or an SFT
run that trains the VAE) saves every weight of the trained module (``ModelState``).
``policy_component`` is the one choice between the two, used by the trainers when they save and
resume; ``model_component`` is what ``cosmos-rl eval``/``export``/``pairs mine`` load as the run's
model (the moving average when the step holds one, read into the ``policy`` adapter, else
``policy``), so a reader never asks which algorithm wrote a checkpoint.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_rl.checkpoint.layout import EMA, POLICY, CheckpointError
from cosmos_rl.checkpoint.state import ModelState, short_list

POLICY_ADAPTER = "policy"  # the LoRA adapter that trains (models.setup names it so for every algorithm)


def policy_component(module: torch.nn.Module, *, lora: bool) -> Stateful:
    """What a run's `policy` component is: adapter `policy` of `module` with LoRA, else every weight."""
    return AdapterState(module, POLICY_ADAPTER) if lora else ModelState(module, trainable_only=False)


def model_component(module: torch.nn.Module, *, lora: bool, stored: Iterable[str]) -> tuple[str, Stateful]:
    """(component name, component) a reader loads as a run's model from a step that holds the
    components `stored`: the moving average `ema` into adapter `policy` when there is one (a GRPO run
    with rl.ema_decay > 0 makes it the run's model), else the `policy` component."""
    if lora and EMA in stored:
        return EMA, AdapterState(module, POLICY_ADAPTER, stored_as=EMA)
    return POLICY, policy_component(module, lora=lora)


def _adapter_index(parts: list[str], adapter: str) -> int | None:
    """Where the adapter's name sits in a parameter name's parts (after `lora_A`, `lora_B`, ...)."""
    for i in range(len(parts) - 1):
        if parts[i].startswith("lora_") and parts[i + 1] == adapter:
            return i + 1
    return None


class AdapterState(Stateful):
    """One named LoRA adapter's parameters (DTensor shards under FSDP2), keyed by parameter name.

    Several adapters of one network (NFT's policy and its moving old policy) are saved as separate
    components, each holding only its own tensors. The values are the parameters' detached views,
    so DCP's in-place load writes straight into the network.
    """

    def __init__(self, module: torch.nn.Module, adapter: str, stored_as: str | None = None):
        self.module = module
        self.adapter = adapter
        # The adapter name the checkpoint keys carry: another adapter's tensors can be read into
        # this one (a GRPO run's moving average `ema` into `policy`, for `cosmos-rl eval`).
        self.stored_as = stored_as or adapter

    def _live(self) -> dict[str, torch.nn.Parameter]:
        live = {name: p for name, p in self.module.named_parameters() if _adapter_index(name.split("."), self.adapter) is not None}
        if not live:
            raise ValueError(f"the network has no LoRA adapter named {self.adapter!r}")
        return live

    def state_dict(self) -> dict[str, Any]:
        return {self._stored_key(name): param.detach() for name, param in self._live().items()}

    def _stored_key(self, name: str) -> str:
        if self.stored_as == self.adapter:
            return name
        parts = name.split(".")
        parts[_adapter_index(parts, self.adapter)] = self.stored_as
        return ".".join(parts)

    def _saved_names(self, saved: set[str]) -> dict[str, str]:
        """live parameter name -> the key a checkpoint holding `saved` stores it under.

        NFT runs before this format (cosmos-rl up to commit 2b69029: `trainers/nft_state.AdapterState`)
        saved their `policy` and `old` adapters keyed without the adapter's name
        (`...to_q.lora_A.weight`); such a step is read under those keys. Every other run, DPO and
        SFT LoRA runs of those versions included, stored the names as they are."""
        live = self._live()
        if self.stored_as != self.adapter:
            return {name: self._stored_key(name) for name in live}
        if set(live) != saved:
            legacy = {}
            for name in live:
                parts = name.split(".")
                del parts[_adapter_index(parts, self.adapter)]
                legacy[name] = ".".join(parts)
            if set(legacy.values()) == saved:
                return legacy
        return {name: name for name in live}

    def template(self, saved: set[str]) -> dict[str, Any]:
        """What DCP reads a step holding the keys `saved` into (`checkpoint.loading`): the live
        tensors under the keys that step stores them under."""
        live = {name: param.detach() for name, param in self._live().items()}
        return {key: live[name] for name, key in self._saved_names(saved).items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        live = self._live()
        names = self._saved_names(set(state_dict))
        missing = sorted(key for key in names.values() if key not in state_dict)
        extra = sorted(set(state_dict) - set(names.values()))
        if missing or extra:
            raise CheckpointError(
                f"adapter {self.adapter!r}: checkpoint keys differ (missing: {short_list(missing) or 'none'}; "
                f"not in the network: {short_list(extra) or 'none'})"
            )
        with torch.no_grad():
            for name, param in live.items():
                param.copy_(state_dict[names[name]])
