"""DCP reads that never run code, on torch's public checkpoint API only.

* ``read_dcp_metadata``: DCP's ``.metadata`` index is a pickle written by torch; it is read by
  ``MetadataUnpickler``, which admits an exact list of (module, name) pairs.
* ``load_dcp``: ``dcp.load`` with ``SafeFileSystemReader`` (that index reader) and
  ``NoPickleLoadPlanner``, which reads DCP's byte entries (optimizer param groups) with
  ``torch.load(weights_only=True)`` instead of the default planner's full unpickling.
* ``flatten_keys``: a state dict's keys as DCP names them (``a.b.0.c``), to compare a template
  with a checkpoint's index before reading anything.

Used for run checkpoints and for a DCP base given as ``rl.init_from``.
"""

from __future__ import annotations

import errno
import pickle
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta

from cosmos_rl.checkpoint.collective import quiet_single_process, single_process
from cosmos_rl.checkpoint.layout import CheckpointError
from cosmos_rl.core.files import open_user_file

# The index file DCP's FileSystemWriter writes (its docstring: a global ``.metadata``, or
# ``__{rank}.metadata`` per rank when the save ran without rank coordination).
METADATA_FILE = ".metadata"


def flatten_keys(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted key -> leaf, the way DCP flattens a state dict before saving it.

    Mappings are always descended (keys joined with ``.``). A list is descended by index only
    when it holds a tensor or a mapping at some depth; otherwise it is one leaf (DCP stores it
    as a byte entry), as are tuples and scalars."""
    flat: dict[str, Any] = {}

    def leaf_list(values: list) -> bool:
        for entry in values:
            if isinstance(entry, (torch.Tensor, Mapping)):
                return False
            if isinstance(entry, list) and not leaf_list(entry):
                return False
        return True

    def visit(key: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(f"{key}.{k}", v)
        elif isinstance(value, list) and not leaf_list(value):
            for i, v in enumerate(value):
                visit(f"{key}.{i}", v)
        else:
            if key in flat:
                raise ValueError(f"two entries of the state dict flatten to the key {key!r}")
            flat[key] = value

    for k, v in state_dict.items():
        visit(str(k), v)
    return flat


class NoPickleLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's default planner unpickles byte entries with ``weights_only=False``; ours only
    accepts tensors and plain containers, and places the value itself (the default would
    unpickle the bytes a second time, unrestricted)."""

    def load_bytes(self, read_item: dcp.ReadItem, value: Any) -> None:
        fqn = read_item.dest_index.fqn
        value.seek(0)
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            why = next((ln for ln in str(exc).splitlines() if "Unsupported global" in ln), "")
            raise ValueError(f"{fqn}: refusing to unpickle a non-plain object. {why.strip()}") from None
        if not self.flatten_state_dict:
            self.state_dict[fqn] = obj
            return
        # `mappings` (public on DefaultLoadPlanner) holds each flattened key's path in the
        # caller's nested dict; the template already has an entry there.
        *parents, last = self.mappings[fqn]
        container: Any = self.original_state_dict
        for part in parents:
            container = container[part]
        container[last] = obj


class MetadataUnpickler(pickle.Unpickler):
    """Reads DCP's ``.metadata`` index, which torch writes with pickle, admitting exactly the
    (module, name) pairs such an index is made of: DCP's metadata records, torch sizes, dtypes,
    layouts and memory formats, paths. A name is matched whole, never as a prefix, and never
    dotted: pickle protocol 4 resolves ``a.b`` as an attribute chain, so a module prefix rule
    would let ``torch.distributed.checkpoint.metadata`` + ``os.system`` through."""

    _DCP_METADATA = "torch.distributed.checkpoint.metadata"
    _ALLOWED = frozenset(
        {
            (_DCP_METADATA, "Metadata"),
            (_DCP_METADATA, "StorageMeta"),
            (_DCP_METADATA, "MetadataIndex"),
            (_DCP_METADATA, "TensorStorageMetadata"),
            (_DCP_METADATA, "BytesStorageMetadata"),
            (_DCP_METADATA, "ChunkStorageMetadata"),
            (_DCP_METADATA, "TensorProperties"),
            (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "Path"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "slice"),
        }
    )
    # torch's own dtype/layout/memory-format singletons, as exact ("torch", name) pairs too.
    _ALLOWED = _ALLOWED | frozenset(
        ("torch", name)
        for name, value in vars(torch).items()
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format))
    )

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing global {module}.{name} in a DCP .metadata file")


# A DCP index lists every tensor's shape and place; even a large model's is tens of MiB.
_MAX_METADATA_FILE = 1 << 30


class SafeFileSystemReader(dcp.FileSystemReader):
    """``dcp.FileSystemReader`` whose ``.metadata`` is read by ``MetadataUnpickler``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp.Metadata:
        rank = kwargs.get("rank")
        name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
        path = Path(self.checkpoint_id) / name
        # core.files: a FIFO in its place is refused instead of blocking the resume forever.
        with open_user_file(path, "checkpoint", "DCP metadata", _MAX_METADATA_FILE) as stream:
            metadata = MetadataUnpickler(stream).load()
        if not isinstance(metadata, dcp.Metadata):
            raise pickle.UnpicklingError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_dcp_metadata(path: Path) -> dcp.Metadata:
    """The ``.metadata`` of a DCP directory, read without admitting arbitrary pickled objects."""
    return SafeFileSystemReader(str(path)).read_metadata()


def describe_dcp_failure(exc: BaseException) -> str:
    """One line per failing rank instead of DCP's multi-traceback text."""
    if isinstance(exc, dcp.CheckpointException):
        return "; ".join(
            f"rank {rank}: {type(err).__name__}: {str(err).strip().splitlines()[0][:400] if str(err).strip() else ''}"
            for rank, (err, _) in sorted(exc.failures.items())
        )
    return f"{type(exc).__name__}: {exc}"


def load_dcp(state_dict: dict[str, Any], path: Path) -> None:
    """``dcp.load`` in place with the no-pickle planner; failures raise ``CheckpointError``
    naming the directory."""
    try:
        with quiet_single_process():
            dcp.load(
                state_dict,
                storage_reader=SafeFileSystemReader(str(path)),
                planner=NoPickleLoadPlanner(),
                no_dist=single_process(),
            )
    except (dcp.CheckpointException, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: reading the DCP files failed: {describe_dcp_failure(exc)}"
        ) from None


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def disk_space_hint(root: Path, to_save: dict[str, Any], exc: BaseException) -> str:
    """A readable cause when a failed write ran out of disk space. DCP's own error for that
    is often an opaque ``inline_container.cc ... unexpected pos`` RuntimeError."""
    errors = [err for err, _ in exc.failures.values()] if isinstance(exc, dcp.CheckpointException) else [exc]
    enospc = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in errors)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return ""
    need = checkpoint_bytes(to_save)
    if enospc or free < need:
        return (
            f" (out of disk space? the filesystem holding {root} has {_mib(free)} free; the "
            f"checkpoint holds about {_mib(need)} of tensors, every rank's share together)"
        )
    return ""


def checkpoint_bytes(to_save: dict[str, Any]) -> int:
    """The tensor bytes one save writes across all ranks, the same number on every rank: a sharded
    DTensor counts its global size (each rank writes its shard), a plain tensor once (DCP writes a
    replicated tensor from one rank only). Summing local tensors instead counted every replicated
    tensor once per rank and each DTensor only by this rank's shard, which is no rank's share."""
    total = 0
    for value in flatten_keys(to_save).values():
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()  # a DTensor's numel is its global one
    return total
