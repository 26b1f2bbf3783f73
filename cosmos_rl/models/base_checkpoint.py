"""Find and load the base weights ``rl.init_from`` names (or ``model.path``'s own, when it is empty).

A base is one of:

* a local diffusers folder: the transformer's ``*.safetensors`` under ``transformer/`` (as
  ``save_pretrained`` writes them, sharded with an ``.index.json`` or not); a folder holding
  the ``*.safetensors`` directly (the ``transformer/`` folder itself) works too;
* a DCP checkpoint directory (recognised by its ``.metadata`` file) whose keys are the
  module's own names, as ``dcp.save(model_state_dict)`` writes them;
* ``s3://bucket/prefix``: pulled once per node into the cache and reused (``s3_cache``).

``rl.init_keys_to_skip_loading`` holds glob patterns (``fnmatch``, case-sensitive; ``*``
crosses dots): ``audio_*`` drops every key starting with ``audio_``, ``head.*`` a submodule,
a pattern without wildcards one exact key. The load is otherwise strict: any key the base
has and the model lacks (or the reverse), a shape mismatch, or a pattern that matches no
base key (a likely typo) fails with a ``UserError`` listing the keys and naming the base as the
user wrote it (the ``s3://`` URL, not the cache folder).
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from cosmos_rl.checkpoint import load_dcp, read_dcp_metadata
from cosmos_rl.checkpoint.weight_files import FolderProblem, folder_weight_shapes
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.layout import S3_SCHEME, base_format
from cosmos_rl.models.s3_cache import INIT_FROM, pull_once

SKIP_KEYS = "rl.init_keys_to_skip_loading"
_SHOWN = 10


def _listing(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    more = len(keys) - _SHOWN
    return ", ".join(keys[:_SHOWN]) + (f" (and {more} more)" if more > 0 else "")


# --------------------------------------------------------------------------- resolving


def _check_local(folder: Path, shown_as: str, key: str = INIT_FROM) -> Path:
    if not folder.exists():
        raise UserError(f"{key}: {shown_as} does not exist; give an existing folder or s3:// URL")
    if not folder.is_dir():
        raise UserError(f"{key}: {shown_as} is a file; give the checkpoint folder")
    if base_format(folder) is None:
        found = sorted(p.name for p in folder.iterdir())[:_SHOWN]
        raise UserError(
            f"{key}: {shown_as} is neither a diffusers folder (transformer/*.safetensors) nor "
            f"a DCP checkpoint (.metadata); it contains {found or 'nothing'}"
        )
    return folder.resolve()


def resolve_init_from(value: str, cache_dir: Path, *, endpoint_url: str | None = None) -> Path:
    """The local folder holding the base checkpoint ``value`` names (``s3://`` pulled once per node)."""
    if not value:
        raise UserError(f"{INIT_FROM} is empty; give a diffusers folder, a DCP folder or s3://bucket/prefix")
    if value.startswith(S3_SCHEME):
        return _check_local(pull_once(value, Path(cache_dir), endpoint_url), value)
    if "://" in value:
        raise UserError(f"{INIT_FROM}: unsupported URL {value!r}; use a local folder or s3://bucket/prefix")
    return _check_local(Path(value).expanduser(), value)


# --------------------------------------------------------------------------- reading


class _BaseCheckpoint:
    """Key -> shape of a base checkpoint, and reading a chosen subset of its tensors."""

    def __init__(self, path: Path, shown_as: str, setting: str):
        found = base_format(path)
        if found is None:
            _check_local(path, shown_as, setting)  # raises with the folder's contents
        self.kind, self.folder = found
        self.shapes: dict[str, tuple[int, ...] | None] = {}  # None: not a tensor
        self._file_of: dict[str, Path] = {}
        if self.kind == "safetensors":
            # Headers only, bounded, and an index's files resolved inside the folder: nothing is
            # read or allocated for a tensor before the keys and shapes are judged below.
            try:
                shapes, self._file_of = folder_weight_shapes(self.folder)
            except FolderProblem as exc:
                raise UserError(f"{setting}: {shown_as}: {exc}") from None
            self.shapes.update(shapes)
        else:
            self._metadata = read_dcp_metadata(self.folder).state_dict_metadata
            for key, md in self._metadata.items():
                self.shapes[key] = tuple(md.size) if isinstance(md, TensorStorageMetadata) else None

    def read(self, keys: set[str]) -> dict[str, torch.Tensor]:
        if self.kind == "safetensors":
            out = {}
            for file in sorted({self._file_of[k] for k in keys}):
                with safe_open(file, framework="pt") as f:
                    out.update({k: f.get_tensor(k) for k in f.keys() if k in keys})
            return out
        template = {
            k: torch.empty(self._metadata[k].size, dtype=self._metadata[k].properties.dtype)
            for k in keys
        }
        load_dcp(template, self.folder)
        return template


# --------------------------------------------------------------------------- loading


def load_base_weights(
    module: torch.nn.Module,
    init_from_path: str | os.PathLike,
    skip_keys: list[str],
    *,
    shown_as: str | None = None,
    setting: str = INIT_FROM,
) -> None:
    """Load the base checkpoint at ``init_from_path`` (from ``resolve_init_from``) into
    ``module`` in place, dropping keys that match a ``skip_keys`` glob; strict otherwise.

    Errors start with ``setting`` (the manifest key that named the base) and call the base
    ``shown_as`` (what the user wrote; default the path). Works on a plain module and on an
    FSDP2-sharded one (each rank reads the full tensors and keeps its shard). Call it before
    adding LoRA adapters: their keys are not in a base."""
    shown = shown_as or str(init_from_path)
    base = _BaseCheckpoint(Path(init_from_path), shown, setting)
    model_shapes = {k: tuple(v.shape) for k, v in get_model_state_dict(module).items()}

    skipped: dict[str, list[str]] = {p: [] for p in skip_keys}
    for key in base.shapes:
        for pattern in skip_keys:
            if fnmatch.fnmatchcase(key, pattern):
                skipped[pattern].append(key)
    dropped = {k for keys in skipped.values() for k in keys}
    kept = set(base.shapes) - dropped

    problems = []
    for pattern, keys in skipped.items():
        if not keys:
            hint = ""
            if not any(ch in pattern for ch in "*?["):
                near = [k for k in base.shapes if k.startswith(pattern)]
                if near:
                    hint = f" (patterns are globs: {pattern + '*'!r} would match {len(near)} keys)"
            problems.append(
                f"{SKIP_KEYS}: {pattern!r} matches no key of the base checkpoint, likely a typo"
                f"{hint}; base keys look like: {_listing(list(base.shapes)[:3])}"
            )
    extra = kept - set(model_shapes)
    if extra:
        problems.append(
            f"{len(extra)} key(s) in the base that the model does not build: {_listing(extra)}; "
            f"if the run leaves them out on purpose, list glob patterns for them in {SKIP_KEYS}"
        )
    missing = set(model_shapes) - kept
    if missing:
        by_skip = missing & dropped
        why = f"; {len(by_skip)} of them dropped by {SKIP_KEYS}: {_listing(by_skip)}" if by_skip else ""
        problems.append(
            f"{len(missing)} model key(s) absent from the base: {_listing(missing)}{why}; "
            f"{setting} must be a checkpoint of this architecture"
        )
    mismatched = sorted(
        f"{k} (base {base.shapes[k]}, model {model_shapes[k]})"
        for k in kept & set(model_shapes)
        if base.shapes[k] != model_shapes[k]
    )
    if mismatched:
        problems.append(f"{len(mismatched)} shape mismatch(es): {_listing(mismatched)}")
    if problems:
        raise UserError(
            f"{setting}: base checkpoint {shown} does not match the model:\n  - "
            + "\n  - ".join(problems)
        )

    state = base.read(kept)
    # full_state_dict: every rank passes whole tensors; FSDP2 modules keep only their shard.
    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=True))
