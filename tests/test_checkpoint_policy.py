"""The one policy format (checkpoint/policy.py): LoRA adapters keyed by their parameter names, the
older NFT layout (keys without the adapter's name) read by the same component, every weight for a
full fine-tune. Runs written by older code are checked end to end in test_old_run_dirs.py."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_rl.checkpoint import CheckpointError, CheckpointManager, ModelState, read_dcp_metadata
from cosmos_rl.checkpoint.policy import AdapterState, policy_component


class Adapted(torch.nn.Module):
    """Two projections each wrapped as peft wraps them: `lora_A`/`lora_B` hold one module per adapter."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList()
        for _ in range(2):
            layer = torch.nn.Module()
            layer.base_layer = torch.nn.Linear(4, 4)
            layer.lora_A = torch.nn.ModuleDict({name: torch.nn.Linear(4, 2, bias=False) for name in ("policy", "old")})
            layer.lora_B = torch.nn.ModuleDict({name: torch.nn.Linear(2, 4, bias=False) for name in ("policy", "old")})
            self.layers.append(layer)


class LegacyAdapter(Stateful):
    """What NFT runs of commit 2b69029 saved: one adapter's tensors keyed without its name."""

    def __init__(self, module: torch.nn.Module, adapter: str):
        self.module, self.adapter = module, adapter

    def state_dict(self):
        return {k.replace(f".{self.adapter}.", "."): v.detach() for k, v in self.module.named_parameters() if f".{self.adapter}." in k}

    def load_state_dict(self, state_dict):
        raise AssertionError("only written")


def _adapter(module: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters() if f".{name}." in k}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("writer", [AdapterState, LegacyAdapter], ids=["today", "nft_before_one_format"])
def test_each_adapter_comes_back_into_itself_from_either_key_layout(writer, tmp_path):
    saved = Adapted(0)
    CheckpointManager(tmp_path, 0).save(1, {"policy": writer(saved, "policy"), "old": writer(saved, "old")})
    keys = read_dcp_metadata(tmp_path / "checkpoints" / "step_1").state_dict_metadata
    named = writer is AdapterState
    assert ("policy.layers.0.lora_A.policy.weight" in keys) is named and ("policy.layers.0.lora_A.weight" in keys) is not named

    loaded = Adapted(1)
    frozen = {k: v.detach().clone() for k, v in loaded.named_parameters() if "base_layer" in k}
    CheckpointManager(tmp_path, 0).load(1, {"policy": AdapterState(loaded, "policy"), "old": AdapterState(loaded, "old")})
    assert _equal(_adapter(loaded, "policy"), _adapter(saved, "policy"))
    assert _equal(_adapter(loaded, "old"), _adapter(saved, "old"))
    assert not _equal(_adapter(loaded, "policy"), _adapter(loaded, "old"))  # not one adapter read twice
    assert _equal({k: v for k, v in loaded.named_parameters() if "base_layer" in k}, frozen)  # nothing else touched


def test_an_adapter_of_other_modules_is_refused_naming_the_keys(tmp_path):
    smaller = Adapted(0)
    del smaller.layers[1]
    CheckpointManager(tmp_path, 0).save(1, {"policy": AdapterState(smaller, "policy")})
    with pytest.raises(CheckpointError, match=r"keys missing from the checkpoint: policy\.layers\.1\.lora_A\.policy\.weight"):
        CheckpointManager(tmp_path, 0).load(1, {"policy": AdapterState(Adapted(1), "policy")})
    with pytest.raises(CheckpointError, match="missing: layers.1.lora_A.policy.weight"):
        AdapterState(Adapted(1), "policy").load_state_dict(AdapterState(smaller, "policy").state_dict())


def test_the_policy_component_is_the_adapter_with_lora_and_every_weight_without():
    net = Adapted(0)
    with_lora = policy_component(net, lora=True)
    assert isinstance(with_lora, AdapterState) and with_lora.adapter == "policy"
    assert set(with_lora.state_dict()) == {f"layers.{i}.lora_{ab}.policy.weight" for i in range(2) for ab in "AB"}
    full = policy_component(net, lora=False)
    assert isinstance(full, ModelState) and set(full.state_dict()) == set(net.state_dict())
