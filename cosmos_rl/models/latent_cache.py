"""VAE latents of images and clips already encoded, so an offline run encodes each input once, not every epoch.

Keyed by the input's content (its exact pixel values, full shape and dtype, so an image [3, H, W]
and a clip [3, F, H, W] never share a key) and by the VAE's identity (a hash of its weights and
config), so a changed input or a different VAE can never be served a stale latent. Kept in memory
and, with a folder, on disk as one safetensors file per input (`models.latent_entry`): ranks of
one run, and later runs on the same data and VAE (a resume included), reuse each other's work.

Trust: an entry read from disk is served only when it verifies (its record names this input and
VAE, the shape and dtype are the ones this input's latents have, the checksum written with it
matches, every value is finite). Any other file is a miss: the input is encoded again, the file
is rewritten, and one warning names the file and what was wrong. The disk is optional: a write
that fails (a full disk, a read-only folder) warns once and the run carries on with the cache in
memory only.

Exactness: encoding is the posterior mode (no randomness). A batch with any input not yet cached
is encoded whole, as it would be without the cache, and every input of it is stored; a batch whose
inputs are all cached is served from the cache. So the first epoch computes exactly what an
uncached run computes, and later epochs read back those values.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch

from cosmos_rl.models.latent_entry import BadEntry, entry_bytes, read_entry
from cosmos_rl.models.latent_keys import input_key, input_keys, vae_identity  # noqa: F401 (input_key: tests)
from cosmos_rl.core.media import MediaSpec, latent_frames, vae_spatial_factor, vae_temporal_factor
from cosmos_rl.models.generate import encode_pixels

log = logging.getLogger(__name__)


def _media(pixels: torch.Tensor) -> MediaSpec:
    """What a batch's samples are, by its rank: images [B, 3, H, W] or clips [B, 3, F, H, W]."""
    if pixels.dim() == 4:
        return MediaSpec.image(pixels.shape[2], pixels.shape[3])
    if pixels.dim() == 5:
        return MediaSpec(frames=pixels.shape[2], height=pixels.shape[3], width=pixels.shape[4])
    raise ValueError(f"the latent cache encodes images [B, 3, H, W] or clips [B, 3, F, H, W], got {tuple(pixels.shape)}")


class LatentCache:
    """`encode(images or clips)` with the VAE, through the cache. `folder` None keeps it in memory only."""

    def __init__(self, vae: torch.nn.Module, folder: Path | None):
        self.vae = vae
        self.identity = vae_identity(vae) if folder is not None else ""
        self.folder = Path(folder) / self.identity if folder is not None else None
        self._memory: dict[str, torch.Tensor] = {}
        self._refused: set[str] = set()  # keys whose file did not verify: their fresh latents replace it
        self._writes = True  # False after a write failed: the cache goes on in memory only
        self.hits = self.misses = 0

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.safetensors"

    def latent_shape(self, input_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        """(C, T, h, w) the VAE makes of one input of `input_shape` ([3, H, W] or [3, F, H, W]),
        from what its network does (`models.media`), never from an entry's own say."""
        config = self.vae.config
        height, width = input_shape[-2:]
        frames = 1 if len(input_shape) == 3 else latent_frames(input_shape[1], vae_temporal_factor(config))
        spatial = vae_spatial_factor(config)
        return int(config.z_dim), frames, height // spatial, width // spatial

    def _lookup(self, key: str, pixels: torch.Tensor) -> torch.Tensor | None:
        if key in self._memory:
            return self._memory[key]
        if self.folder is None:
            return None
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            latent = read_entry(path, key, self.identity, self.latent_shape(tuple(pixels.shape)), pixels.dtype)
        except BadEntry as bad:
            log.warning("latent cache entry %s %s: not used; the input is encoded again and the entry rewritten", path, bad)
            self._refused.add(key)
            return None
        self._memory[key] = latent
        return latent

    def _store(self, key: str, latent: torch.Tensor) -> None:
        latent = latent.detach().cpu().contiguous()
        if not bool(torch.isfinite(latent).all()):
            return  # never cached: every later step encodes it again, as an uncached run does
        self._memory[key] = latent
        if self.folder is None or not self._writes:
            return
        path = self._path(key)
        if path.is_file() and key not in self._refused:
            return  # another rank or run wrote it
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_file(tmp, entry_bytes(latent, key, self.identity))
            os.replace(tmp, path)  # atomic: a rank reading it sees a whole file or none
        except OSError as exc:
            self._writes = False
            with contextlib.suppress(OSError):  # a half-written file of a full disk
                tmp.unlink(missing_ok=True)
            log.warning(
                "latent cache: cannot write %s (%s); carrying on without writing to the cache folder "
                "(latents stay in this process's memory; entries already on disk are still read)",
                path, exc.strerror or exc,
            )
            return
        self._refused.discard(key)

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalised latents [B, C, T, h, w] of images [B, 3, H, W] (T = 1) or clips [B, 3, F, H, W]
        (see the module docstring)."""
        media = _media(pixels)
        keys = input_keys(pixels)
        found = [self._lookup(key, item) for key, item in zip(keys, pixels)]
        if all(latent is not None for latent in found):
            self.hits += len(keys)
            return torch.stack(found).to(pixels.device)
        self.misses += sum(latent is None for latent in found)
        latents = encode_pixels(self.vae, media, pixels)
        for key, latent in zip(keys, latents):
            self._store(key, latent)
        return latents


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
