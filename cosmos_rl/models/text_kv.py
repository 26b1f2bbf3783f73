"""Text-tower reuse: each prompt's per-layer text keys and values, computed once and read again.

In a Cosmos3 decoder layer the text (understanding) tokens attend causally to the prompt alone and
the timestep embedding reaches vision tokens only, so the text stream of every layer, and the keys
(`k_und_for_gen`: after `norm_k`, the optional `k_norm_und_for_gen` and RoPE) and values (`v_und`)
that vision tokens read from it, depend only on the prompt's token ids and the text tower's
weights. When those weights cannot change between two forwards and need no gradient, a later
forward may read them instead of running the text tower again: every sampler step after the
first, every repeat of a prompt (eval seeds, mined samples, a group's rollouts, the training
timesteps of a sample) and the old, reference and policy forwards of a training step, which
differ only in the generation tower's adapter.

How a forward uses it (`packing.velocity` asks `plan_for`):
- all of the batch's prompts held -> "reuse": the text stream enters the decoder layers empty
  (no text-tower compute at all), each layer's attention reads the held keys/values, and the text
  rows of the final hidden state are zeros (only vision rows are ever read);
- otherwise -> "record": the ordinary forward, which also keeps what it computed for each prompt.
The plan rides in the rotary tuple each decoder layer gets (like packing's segments), so
activation checkpointing recomputes a layer with the plan of its own forward.

When it is off (`plan_for` returns None; the forward is exactly today's):
- the text tower carries a LoRA layer (e.g. the default targets or `understanding`): adapters are
  switched between forwards (old, policy, disabled), so held values could belong to another one --
  except inside `held_while_sampling`, a no-grad sampling loop (a rollout, an evaluation pass) in
  which neither the weights nor the active adapter change, whose entries live only inside it;
- the forward builds a graph and a text-tower weight requires grad (a full fine-tune's training
  forwards): its gradient would go through the text tower;
- `disabled(transformer)` is active (benchmarks compare both ways).

Never stale: entries live until the next optimizer step (`models/setup.optimizer_step` calls
`new_step`) or state-dict load, are dropped whenever a text-tower weight of an unsharded model
was replaced or changed in place (each parameter's identity and version counter are checked every
forward), and are bounded in bytes (least recently used first out; a single batch may exceed the
bound). Held tensors carry no autograd history.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

import torch

from cosmos_rl.models.towers import UNDERSTANDING_PARAMS

# Most bytes of keys/values one transformer holds (a Cosmos3-Nano prompt of 300 tokens in bf16 is
# about 44 MB over 36 layers).
MAX_BYTES = 2 << 30

_ATTRIBUTE = "_cosmos_rl_text_kv"
_live: "weakref.WeakSet[TextKVCache]" = weakref.WeakSet()


class TextKVCache:
    """One transformer's held keys/values: prompt key -> per-layer [(k, v)] ([L, kv_heads, dim] each)."""

    def __init__(self, transformer: torch.nn.Module, max_bytes: int = MAX_BYTES):
        layers = getattr(transformer, "layers", ())
        self.layer_of = {id(layer.self_attn): index for index, layer in enumerate(layers)}
        self.num_layers = len(layers)
        self.entries: OrderedDict[bytes, list] = OrderedDict()
        self.fingerprint: tuple = ()
        self.max_bytes = max_bytes
        self.bytes = 0
        self.enabled = True
        # Inside held_while_sampling: the text tower's LoRA layers, whose entries are held despite them.
        self.sampling: list[torch.nn.Module] | None = None
        self.counts = {"record": 0, "reuse": 0}  # forwards of each kind, for benchmarks and tests

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def _evict(self, keep: set[bytes]) -> None:
        for key in list(self.entries):
            if self.bytes <= self.max_bytes:
                return
            if key not in keep:
                self.bytes -= _entry_bytes(self.entries.pop(key))


def _entry_bytes(entry: list) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in entry if k is not None)


class TextKVPlan:
    """What one forward does with held keys/values (a plain object: FSDP's input casts and
    checkpointing pass it through untouched). `slots`: one per-layer list per sample, in packed
    order (samples with equal prompts share one); `reuse`: read them, else fill the empty ones of
    `lengths` tokens each and, once the forward returned, `finish` hands the full ones to the cache."""

    __slots__ = ("reuse", "slots", "layer_of", "lengths", "on_finish")

    def __init__(self, reuse: bool, slots: list[list], layer_of: dict[int, int], lengths=(), on_finish=None):
        self.reuse, self.slots, self.layer_of = reuse, slots, layer_of
        self.lengths, self.on_finish = list(lengths), on_finish

    def keys_values(self, attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's text keys and values for this layer, packed: ([U, kv_heads, dim], same)."""
        layer = self.layer_of[id(attn)]
        pairs = [slot[layer] for slot in self.slots]
        if len(pairs) == 1:
            return pairs[0]
        return torch.cat([k for k, _ in pairs]), torch.cat([v for _, v in pairs])

    def keep(self, attn: torch.nn.Module, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Record mode: keep each sample's rows of this layer's packed text keys/values (a
        checkpoint recompute finds its slots filled and keeps nothing twice)."""
        layer = self.layer_of.get(id(attn))
        if layer is None:
            return
        at = 0
        for slot, length in zip(self.slots, self.lengths):
            if slot[layer] is None:
                slot[layer] = (keys[at : at + length].detach().clone(), values[at : at + length].detach().clone())
            at += length


def finish(plan: TextKVPlan | None) -> None:
    """Called after the forward of `plan`: a record plan's filled entries join the cache."""
    if plan is not None and plan.on_finish is not None:
        plan.on_finish()
        plan.on_finish = None


def _text_tower_state(transformer: torch.nn.Module, sampling: list | None = None) -> tuple[bool, tuple]:
    """(usable, fingerprint): usable when no text-tower parameter belongs to a LoRA layer (with
    `sampling`, the text tower's LoRA layers inside held_while_sampling: in any no-grad forward)
    and, in a graph-building forward, none requires grad. The fingerprint is every text-tower
    parameter's identity and in-place version; FSDP2 swaps a module's registered parameters between
    shards and gathered copies around every forward, so a sharded model has none (its weights change
    only through optimizer steps and state-dict loads, which drop the entries themselves). With
    `sampling` it also holds which adapter each of those layers runs, so a switch inside the loop
    drops the entries."""
    from torch.distributed.fsdp import FSDPModule

    grad = torch.is_grad_enabled()
    track = not isinstance(transformer, FSDPModule)
    fingerprint = []
    for name, param in transformer.named_parameters():
        if not UNDERSTANDING_PARAMS.search(name):
            continue
        if ("lora_" in name and (grad or sampling is None)) or (grad and param.requires_grad):
            return False, ()
        if track:
            fingerprint.append((id(param), param._version))
    if sampling is not None:
        fingerprint.extend((tuple(m.active_adapters), bool(m.disable_adapters)) for m in sampling)
    return True, tuple(fingerprint)


def _text_tower_lora_layers(transformer: torch.nn.Module) -> list[torch.nn.Module]:
    from cosmos_rl.models.lora import tuner_layers

    return [module for path, module in tuner_layers(transformer) if UNDERSTANDING_PARAMS.search(path + ".")]


@contextmanager
def held_while_sampling(transformer: torch.nn.Module) -> Iterator[None]:
    """Forwards inside the block hold the text tower's keys/values from the first forward of each
    prompt even when the text tower carries LoRA layers. For a no-grad sampling loop only (a
    rollout, an evaluation pass): its weights and its active adapter cannot change between its
    sampler steps, so every step after the first and every repeat of a prompt reads what the first
    computed. Such entries could belong to another adapter outside the block, so they are dropped
    at entry and at exit; graph-building forwards inside it keep today's rule. Without a text-tower
    adapter the block changes nothing (the everyday rule already holds the entries)."""
    cache = cache_of(transformer)
    layers = _text_tower_lora_layers(transformer)
    if cache.sampling is not None or not layers:
        yield
        return
    cache.clear()
    cache.sampling = layers
    try:
        yield
    finally:
        cache.sampling = None
        cache.clear()


def cache_of(transformer: torch.nn.Module) -> TextKVCache:
    """The transformer's cache (made on first use)."""
    cache = transformer.__dict__.get(_ATTRIBUTE)
    if cache is None:
        cache = TextKVCache(transformer)
        # In the instance dict: a plain attribute, never a submodule, buffer or state-dict entry.
        transformer.__dict__[_ATTRIBUTE] = cache
        transformer.register_load_state_dict_post_hook(lambda module, incompatible: cache.clear())
        _live.add(cache)
    return cache


def plan_for(transformer: torch.nn.Module, prompt_ids: list[torch.Tensor]) -> TextKVPlan | None:
    """The plan of a packed forward over these prompts (in packed order), or None (reuse is off)."""
    cache = cache_of(transformer)
    if not cache.enabled or cache.num_layers == 0:
        return None
    usable, fingerprint = _text_tower_state(transformer, cache.sampling)
    if not usable:
        return None
    if fingerprint != cache.fingerprint:
        cache.clear()
        cache.fingerprint = fingerprint
    lengths = [int(ids.numel()) for ids in prompt_ids]
    flat = torch.cat([ids.reshape(-1) for ids in prompt_ids]).to("cpu", torch.long).numpy()
    keys, at = [], 0
    for length in lengths:
        keys.append(flat[at : at + length].tobytes())
        at += length
    if all(key in cache.entries for key in keys):
        for key in keys:
            cache.entries.move_to_end(key)
        cache.counts["reuse"] += 1
        return TextKVPlan(True, [cache.entries[key] for key in keys], cache.layer_of)
    slots = {}
    for key in keys:
        if key not in slots:
            slots[key] = cache.entries.get(key) or [None] * cache.num_layers
    plan_keys = list(slots)

    def commit() -> None:
        for key in plan_keys:
            entry = slots[key]
            if key not in cache.entries and all(pair is not None for pair in entry):
                cache.entries[key] = entry
                cache.bytes += _entry_bytes(entry)
        cache._evict(set(plan_keys))

    cache.counts["record"] += 1
    return TextKVPlan(False, [slots[key] for key in keys], cache.layer_of, lengths, commit)


def new_step() -> None:
    """An optimizer step happened: every transformer's held keys/values are dropped."""
    for cache in list(_live):
        cache.clear()


@contextmanager
def disabled(transformer: torch.nn.Module) -> Iterator[None]:
    """Forwards of `transformer` inside the block run the text tower every time (today's path)."""
    cache = cache_of(transformer)
    before = cache.enabled
    cache.enabled = False
    try:
        yield
    finally:
        cache.enabled = before
