"""One latent cache entry on disk: a safetensors file whose metadata says what it holds.

An entry is one tensor, `latent` ([C, T, h, w]: T = 1 for an image, more for a clip), and string
metadata: the entry format, the key of the input it was encoded from, the VAE identity, the shape,
the dtype and the SHA-256 of the tensor's bytes. `read_entry` serves a file only when all of it
agrees with what the caller expects for this input (shape and dtype worked out from the input and
the VAE, not read from the file) and every value is finite; anything else raises `BadEntry` with
what was wrong. safetensors metadata is plain strings and reading the file runs no code.

The checksum detects damage (a flipped bit, a torn copy), not tampering: whoever can rewrite an
entry can rewrite its metadata too. The expected shape and dtype and the finite check bound what
such a file can do to a run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import open_user_file

# Entries without this record (written before entries were verified) or with another are refused.
FORMAT = "cosmos-rl latent entry 2"
TENSOR = "latent"
_FIELDS = ("format", "key", "vae", "shape", "dtype", "sha256")


# No latent of a clip the project trains is near this; the shape check below is the real bound.
_MAX_ENTRY_BYTES = 1 << 34


class BadEntry(Exception):
    """An entry that must not be served; the message says what was wrong with it."""


def _shown(value: object, limit: int = 60) -> str:
    """Text read from the file, escaped and cut short for a warning line."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def checksum(latent: torch.Tensor) -> str:
    return hashlib.sha256(latent.contiguous().view(torch.uint8).numpy()).hexdigest()


def entry_bytes(latent: torch.Tensor, key: str, vae: str) -> bytes:
    """The whole file for `latent` (contiguous, on the CPU) encoded from the input `key` by `vae`."""
    record = {
        "format": FORMAT,
        "key": key,
        "vae": vae,
        "shape": json.dumps(list(latent.shape)),
        "dtype": str(latent.dtype),
        "sha256": checksum(latent),
    }
    return save({TENSOR: latent}, metadata=record)


def read_entry(path: Path, key: str, vae: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The latent `path` holds, when it is a whole entry for input `key` and `vae` of `shape` and
    `dtype`; raises BadEntry otherwise. The shape is checked from the header before the tensor is
    read, so a file cannot make this allocate more than `shape` of the widest dtype."""
    try:
        # safe_open would block forever on a FIFO in an entry's place: core.files refuses anything
        # that is not a regular file first, opening without blocking.
        open_user_file(path, "", "latent cache entry", _MAX_ENTRY_BYTES).close()
    except UserError as exc:
        raise BadEntry(f"is not a readable entry ({exc})") from None
    try:
        with safe_open(str(path), framework="pt") as handle:
            record = handle.metadata() or {}
            _check_record(record, key, vae)
            names = list(handle.keys())
            if names != [TENSOR]:
                raise BadEntry(f"holds the tensors {_shown(names)} instead of one {TENSOR!r}")
            found = tuple(handle.get_slice(TENSOR).get_shape())
            if found != tuple(shape):
                raise BadEntry(f"holds latents of shape {_shown(found)}; this input's latents are {tuple(shape)}")
            latent = handle.get_tensor(TENSOR)
    except (OSError, SafetensorError, ValueError, RuntimeError) as exc:
        raise BadEntry(f"is not a readable safetensors file ({_shown(str(exc), 120)})") from None
    if latent.dtype != dtype:
        raise BadEntry(f"holds {latent.dtype} latents; this input's are {dtype}")
    if record["shape"] != json.dumps(list(shape)) or record["dtype"] != str(dtype):
        raise BadEntry(
            f"records shape {_shown(record['shape'])} and dtype {_shown(record['dtype'])} "
            f"but holds {list(shape)} {dtype} (damaged)"
        )
    if checksum(latent) != record["sha256"]:
        raise BadEntry("holds values that do not match the checksum written with them (damaged)")
    bad = int((~torch.isfinite(latent)).sum())
    if bad:
        raise BadEntry(f"holds {bad} non-finite values")
    return latent


def _check_record(record: dict[str, str], key: str, vae: str) -> None:
    if record.get("format") != FORMAT:
        if "format" not in record:
            raise BadEntry("has no entry record (an older release's entry, or not a cosmos-rl entry)")
        raise BadEntry(f"has the entry format {_shown(record['format'])}; this release reads {FORMAT!r}")
    missing = [name for name in _FIELDS if name not in record]
    if missing:
        raise BadEntry(f"lacks the record fields {missing}")
    if record["key"] != key:
        raise BadEntry(f"was written for another input (key {_shown(record['key'])})")
    if record["vae"] != vae:
        raise BadEntry(f"was written for another VAE ({_shown(record['vae'])})")
