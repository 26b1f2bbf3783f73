"""What a latent cache entry is keyed by: the VAE's identity (the folder) and the input's content (the file).

Torch only (no diffusers), so a fresh process can compute an identity cheaply. Both are the same
in every process and on every rank: nothing here depends on Python's string hashing or on where
the VAE was loaded from.
"""

from __future__ import annotations

import hashlib
import json

import torch

# The stored tensors' layout, part of the identity: entries written as [C, h, w] before latents
# carried their time axis are never served as [C, 1, h, w] ones.
_LAYOUT = "latent [C, T, h, w]"


def _canonical(value):
    """`value` with every unordered collection sorted, so its JSON is the same in every process."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True, default=str))
    return value


def canonical_json(value) -> str:
    """`value` as JSON that is the same in every process (unordered collections sorted, keys sorted)."""
    return json.dumps(_canonical(value), sort_keys=True, default=str)


def vae_identity(vae: torch.nn.Module) -> str:
    """A short hash of the entry layout, the VAE's config and every weight (computed once per run).

    The config's public keys are what build the network and normalise its latents. Its private
    `_` keys are bookkeeping that says nothing about the numbers and would split one VAE into many
    ids: `_use_default_values` lists names in an order that follows Python's string hashing (so it
    changes with PYTHONHASHSEED), `_name_or_path` the folder it was loaded from, `_diffusers_version`
    the library that wrote it."""
    config = {name: value for name, value in dict(vae.config).items() if not str(name).startswith("_")}
    digest = hashlib.sha256(_LAYOUT.encode())
    digest.update(canonical_json(config).encode())
    for name, tensor in sorted(vae.state_dict().items()):
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:20]


def input_key(pixels: torch.Tensor) -> str:
    """The content key of one image [3, H, W] or clip [3, F, H, W]: its full shape, dtype and bytes."""
    flat = pixels.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{tuple(flat.shape)}|{flat.dtype}|".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def input_keys(batch: torch.Tensor) -> list[str]:
    """`input_key` of every item of `batch` [B, ...] (the same strings), the batch moved to the CPU
    and viewed as bytes once rather than once per item."""
    flat = batch.detach().cpu().contiguous()
    if flat.shape[0] == 0:
        return []
    head = f"{tuple(flat.shape[1:])}|{flat.dtype}|".encode()
    rows = flat.view(torch.uint8).numpy().reshape(flat.shape[0], -1)
    keys = []
    for row in rows:
        digest = hashlib.sha256(head)
        digest.update(row)
        keys.append(digest.hexdigest())
    return keys
