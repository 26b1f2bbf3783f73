"""VAE latents of images already encoded, so an offline run encodes each image once, not every epoch.

Keyed by the image's content (its exact pixel values, shape and dtype) and by the VAE's identity (a
hash of its weights and config), so a changed image or a different VAE can never be served a stale
latent. Kept in memory and, with a folder, on disk as one safetensors file per image: ranks of one
run, and later runs on the same data and VAE (a resume included), reuse each other's work.

Exactness: encoding is the posterior mode (no randomness). A batch with any image not yet cached
is encoded whole, as it would be without the cache, and every image of it is stored; a batch whose
images are all cached is served from the cache. So the first epoch computes exactly what an
uncached run computes, and later epochs read back those values.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from cosmos_rl.models.vae import encode_images

_KEY = "latent"
# The stored tensors' layout, part of the identity: entries written as [C, h, w] before latents
# carried their time axis are never served as [C, 1, h, w] ones.
_LAYOUT = "latent [C, T, h, w]"


def vae_identity(vae: torch.nn.Module) -> str:
    """A short hash of the entry layout, the VAE's config and every weight (computed once per run)."""
    digest = hashlib.sha256(_LAYOUT.encode())
    digest.update(json.dumps(dict(vae.config), sort_keys=True, default=str).encode())
    for name, tensor in sorted(vae.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:20]


def image_key(image: torch.Tensor) -> str:
    flat = image.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{tuple(flat.shape)}|{flat.dtype}|".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class LatentCache:
    """`encode(images)` with the VAE, through the cache. `folder` None keeps it in memory only."""

    def __init__(self, vae: torch.nn.Module, folder: Path | None):
        self.vae = vae
        self.folder = Path(folder) / vae_identity(vae) if folder is not None else None
        self._memory: dict[str, torch.Tensor] = {}
        self.hits = self.misses = 0

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.safetensors"

    def _lookup(self, key: str) -> torch.Tensor | None:
        if key in self._memory:
            return self._memory[key]
        if self.folder is not None:
            path = self._path(key)
            if path.is_file():
                try:
                    latent = load_file(str(path))[_KEY]
                except Exception:  # a damaged entry is only a miss: it is encoded again and rewritten
                    return None
                self._memory[key] = latent
                return latent
        return None

    def _store(self, key: str, latent: torch.Tensor) -> None:
        latent = latent.detach().cpu().contiguous()
        self._memory[key] = latent
        if self.folder is None:
            return
        path = self._path(key)
        if path.is_file():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        save_file({_KEY: latent}, str(tmp))
        os.replace(tmp, path)  # atomic: a rank reading it sees a whole file or none

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised latents [B, C, 1, h, w] of images [B, 3, H, W] (see the module docstring)."""
        keys = [image_key(image) for image in images]
        found = [self._lookup(key) for key in keys]
        if all(latent is not None for latent in found):
            self.hits += len(keys)
            return torch.stack(found).to(images.device)
        self.misses += sum(latent is None for latent in found)
        latents = encode_images(self.vae, images)
        for key, latent in zip(keys, latents):
            self._store(key, latent)
        return latents
