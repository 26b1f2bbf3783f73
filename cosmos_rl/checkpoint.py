"""Run checkpoints: DCP save/load of named components with an atomic commit.

Layout under ``<run_dir>/checkpoints/``::

    step_<N>/                 a committed checkpoint (only once ``COMMITTED`` exists)
        .metadata, *.distcp   the DCP checkpoint (every component, one key namespace each)
        meta.json             step, world_size, run identity, algorithm, components, file sizes
        COMMITTED             written last; a directory without it never counts
    step_<N>.tmp-<nonce>/     a save in progress (or one that crashed); never read
    step_<N>.deleting-<nonce>/ a pruned checkpoint being removed

A save writes everything into the ``.tmp-`` directory, waits for every rank, then rank 0
writes ``meta.json`` and ``COMMITTED``, fsyncs and renames the directory to ``step_<N>/``.
A crash at any point leaves the previously committed checkpoints untouched.

Components are saved under their own name (``model.<fqn>``, ``optimizer.state...``):

* ``ModelState`` / ``OptimizerState`` wrap ``torch.distributed.checkpoint.state_dict`` so
  FSDP2 shards save sharded and load with resharding onto any world size.
* ``PlainState`` (or a plain ``dict``) holds ints/floats/strings/bools/None/lists/dicts and
  tensors: the non-tensor part is stored as UTF-8 JSON bytes in a uint8 tensor, so nothing is
  ever unpickled on load. ``RngStreams`` is the per-rank RNG state built on it.

Loading never unpickles arbitrary objects: DCP's byte entries (optimizer param groups) are
read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pickle
import random
import re
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.utils import CheckpointException

from cosmos_rl.errors import UserError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "meta.json"
COMMIT_MARKER = "COMMITTED"
_STEP_DIR = re.compile(r"^step_(0|[1-9][0-9]*)$")
_SCRATCH_DIR = re.compile(r"^step_[0-9]+\.(tmp|deleting)-[0-9a-f]+$")
_COMPONENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TENSOR_REF = "__tensor__"
_LIST_LIMIT = 10


def checkpoint_due(step: int, max_steps: int, every: int) -> bool:
    """The cadence rule of `checkpoint.every`: every `every` steps (0 = never) and always the last."""
    return step == max_steps or (every > 0 and step % every == 0)


class CheckpointError(UserError):
    """A checkpoint could not be saved or loaded; the message names the directory and keys."""


# --------------------------------------------------------------------------- distributed


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _single_process() -> bool:
    """No process group: DCP then runs locally (and would warn about it on every call)."""
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns on every single-process call that it assumes a single process; that is
    exactly what we mean, so the warning only buries real ones."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _agree(problems: list[str]) -> list[str]:
    """Every rank's problems, on every rank, so all ranks raise together instead of some
    entering a collective the others never reach (which would hang until the timeout)."""
    _, world = _rank_and_world()
    if world == 1:
        return problems
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, problems)
    merged: list[str] = []
    for rank, rank_problems in enumerate(gathered):
        merged.extend(f"rank {rank}: {p}" for p in rank_problems)
    return merged


def _from_rank0(value: Any) -> Any:
    _, world = _rank_and_world()
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _short_list(items: list[str]) -> str:
    shown = ", ".join(items[:_LIST_LIMIT])
    more = len(items) - _LIST_LIMIT
    return f"{shown} (and {more} more)" if more > 0 else shown


# --------------------------------------------------------------------------- plain state


def encode_plain(data: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Flat ``{"json": uint8, "t0": ..., "t1": ...}`` tensors holding ``data`` exactly.

    Tensors are cloned to CPU and referenced from the JSON by index. Tuples come back as
    lists; dict keys must be strings (JSON would silently turn other keys into strings)."""
    tensors: list[torch.Tensor] = []

    def convert(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value.detach().to("cpu", copy=True).contiguous())
            return {_TENSOR_REF: len(tensors) - 1}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            return [convert(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            out = {}
            for key, v in value.items():
                if not isinstance(key, str):
                    raise TypeError(f"plain state {path}: dict key {key!r} is not a string")
                if key == _TENSOR_REF:
                    raise TypeError(f"plain state {path}: the key {_TENSOR_REF!r} is reserved")
                out[key] = convert(v, f"{path}.{key}")
            return out
        raise TypeError(
            f"plain state {path}: {type(value).__name__} is not storable; use ints, floats, "
            "strings, bools, None, lists, dicts or tensors"
        )

    if not isinstance(data, dict):
        raise TypeError(f"plain state must be a dict, got {type(data).__name__}")
    doc = json.dumps(convert(data, "<root>"), sort_keys=True).encode("utf-8")
    flat = {"json": torch.frombuffer(bytearray(doc), dtype=torch.uint8)}
    flat.update({f"t{i}": t for i, t in enumerate(tensors)})
    return flat


def decode_plain(flat: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Inverse of ``encode_plain``."""
    doc = json.loads(bytes(flat["json"].tolist()).decode("utf-8"))

    def restore(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_TENSOR_REF}:
                return flat[f"t{value[_TENSOR_REF]}"]
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    return restore(doc)


class PlainState:
    """A dict of plain values saved without pickle.

    ``per_rank=False``: the same on every rank, saved once (ranks must agree; DCP keeps one
    copy). ``per_rank=True``: each rank saves and restores its own copy (RNG streams, a
    rank's data cursor); loading it needs the world size it was saved with.
    Subclasses override ``capture``/``restore`` to read/write live state instead of ``data``.
    """

    def __init__(self, data: dict[str, Any] | None = None, *, per_rank: bool = False):
        self.data: dict[str, Any] = {} if data is None else data
        self.per_rank = per_rank

    def capture(self) -> dict[str, Any]:
        return self.data

    def restore(self, data: dict[str, Any]) -> None:
        # In place, so a caller holding the dict sees the loaded values.
        self.data.clear()
        self.data.update(data)


def rng_state() -> dict[str, Any]:
    """Every global RNG stream of this process as plain values (no pickles)."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch_cpu": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "kind": kind,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "cuda": [],
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured; refuses a different CUDA device count, since the
    streams could not continue exactly."""
    cuda_states = list(state["cuda"])
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(cuda_states) != devices:
        raise CheckpointError(
            f"RNG state was saved with {len(cuda_states)} CUDA device(s) but this process has "
            f"{devices}; resume on the same kind of machine for an exact resume"
        )
    torch.set_rng_state(state["torch_cpu"])
    if cuda_states:
        torch.cuda.set_rng_state_all(cuda_states)
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["kind"],
            np.asarray(npy["keys"], dtype=np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )


class RngStreams(PlainState):
    """This rank's global RNG streams: captured at save, set back at load."""

    def __init__(self) -> None:
        super().__init__(per_rank=True)

    def capture(self) -> dict[str, Any]:
        return rng_state()

    def restore(self, data: dict[str, Any]) -> None:
        set_rng_state(data)


# --------------------------------------------------------------------------- model / optimizer


class ModelState(Stateful):
    """Model weights through the distributed state-dict API (FSDP2 shards stay sharded).

    ``trainable_only=True`` saves only parameters with ``requires_grad`` (LoRA adapters).
    Loading then uses ``strict=False`` because frozen weights are absent on purpose, so we
    check ourselves that exactly the trainable keys were loaded."""

    def __init__(self, model: torch.nn.Module, *, trainable_only: bool = False):
        self.model = model
        self.trainable_only = trainable_only

    def _options(self) -> StateDictOptions:
        return StateDictOptions(
            ignore_frozen_params=self.trainable_only, strict=not self.trainable_only
        )

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model, options=self._options())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        expected = set(self.state_dict())
        result = set_model_state_dict(self.model, state_dict, options=self._options())
        unexpected = sorted(result.unexpected_keys)
        not_loaded = sorted(set(result.missing_keys) & expected)
        absent = sorted(expected - set(state_dict))
        problems = []
        if unexpected:
            problems.append(f"keys the model does not have: {_short_list(unexpected)}")
        if not_loaded or absent:
            problems.append(f"keys not loaded: {_short_list(sorted(set(not_loaded + absent)))}")
        if problems:
            raise CheckpointError("model weights did not load exactly; " + "; ".join(problems))


class OptimizerState(Stateful):
    """Optimizer state (moments, step counts, param groups) keyed by parameter FQN."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        # get_optimizer_state_dict initialises empty Adam moments (zero-grad step at lr 0),
        # so a fresh optimizer yields a complete template to load into.
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


# --------------------------------------------------------------------------- DCP helpers


class LRScheduleState(PlainState):
    """An LR scheduler's counters as plain values; its lambda is rebuilt from the config, not stored."""

    def __init__(self, schedule: torch.optim.lr_scheduler.LRScheduler):
        super().__init__()
        self.schedule = schedule

    def capture(self) -> dict[str, Any]:
        return {k: v for k, v in self.schedule.state_dict().items() if k != "lr_lambdas"}

    def restore(self, data: dict[str, Any]) -> None:
        state = self.schedule.state_dict()
        state.update(data)
        self.schedule.load_state_dict(state)


class _NoPickleLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner unpickles byte entries with ``weights_only=False``; ours only
    accepts tensors and plain containers."""

    def load_bytes(self, read_item: ReadItem, value: Any) -> None:
        value.seek(0)
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            why = next((ln for ln in str(exc).splitlines() if "Unsupported global" in ln), "")
            raise ValueError(
                f"{read_item.dest_index.fqn}: refusing to unpickle a non-plain object. {why.strip()}"
            ) from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class _MetadataUnpickler(pickle.Unpickler):
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
    # torch's own dtype/layout/memory-format singletons, by exact attribute name.
    _TORCH_SCALARS = frozenset(
        name
        for name, value in vars(torch).items()
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format))
    )

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and name in self._TORCH_SCALARS:
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing global {module}.{name} in a DCP .metadata file")


class SafeFileSystemReader(dcp.FileSystemReader):
    """``dcp.FileSystemReader`` whose ``.metadata`` is read by ``_MetadataUnpickler``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_dcp_metadata(path: Path) -> Metadata:
    """The ``.metadata`` of a DCP directory, read without admitting arbitrary pickled objects."""
    return SafeFileSystemReader(str(path)).read_metadata()


def describe_dcp_failure(exc: BaseException) -> str:
    """One line per failing rank instead of DCP's multi-traceback text."""
    if isinstance(exc, CheckpointException):
        return "; ".join(
            f"rank {rank}: {type(err).__name__}: {str(err).strip().splitlines()[0][:400] if str(err).strip() else ''}"
            for rank, (err, _) in sorted(exc.failures.items())
        )
    return f"{type(exc).__name__}: {exc}"


def load_dcp(state_dict: dict[str, Any], path: Path) -> None:
    """``dcp.load`` in place with the no-pickle planner; failures raise ``CheckpointError``
    naming the directory."""
    try:
        with _quiet_single_process():
            dcp.load(
                state_dict,
                storage_reader=SafeFileSystemReader(str(path)),
                planner=_NoPickleLoadPlanner(),
                no_dist=_single_process(),
            )
    except (CheckpointException, OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: reading the DCP files failed: {describe_dcp_failure(exc)}"
        ) from None


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _disk_space_hint(root: Path, to_save: dict[str, Any], exc: BaseException) -> str:
    """A readable cause when a failed write ran out of disk space. DCP's own error for that
    is often an opaque ``inline_container.cc ... unexpected pos`` RuntimeError."""
    errors = [err for err, _ in exc.failures.values()] if isinstance(exc, CheckpointException) else [exc]
    enospc = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in errors)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return ""
    need = 0
    for value in flatten_state_dict(to_save)[0].values():
        if isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            need += local.numel() * local.element_size()
    if enospc or free < need:
        return (
            f" (out of disk space? the filesystem holding {root} has {_mib(free)} free; this "
            f"rank's share of the checkpoint is about {_mib(need)})"
        )
    return ""


def _flat_keys(tree: dict[str, Any]) -> set[str]:
    flat, _ = flatten_state_dict(tree)
    return set(flat)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _file_sizes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()
    }


# --------------------------------------------------------------------------- manager


Component = Any  # Stateful (ModelState, OptimizerState, ...), PlainState or a plain dict


def _as_component(value: Component) -> Stateful | PlainState:
    if isinstance(value, PlainState):
        return value
    if isinstance(value, dict):
        return PlainState(value)
    if isinstance(value, Stateful):
        return value
    raise TypeError(
        f"checkpoint component of type {type(value).__name__} is neither Stateful, "
        "PlainState nor dict"
    )


def _plain_prefix(name: str, state: PlainState, rank: int) -> str:
    return f"{name}.rank{rank}." if state.per_rank else f"{name}."


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run directory.

    ``keep``: how many committed checkpoints ``prune`` (called after every save) keeps,
    newest first; ``0`` keeps all. The newest committed checkpoint is never removed.
    ``run_identity`` / ``algorithm`` go into ``meta.json``; when given, ``load`` refuses a
    checkpoint whose recorded identity differs (it belongs to another run).
    All methods that touch DCP are collective: call them on every rank.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        keep: int,
        *,
        run_identity: str | None = None,
        algorithm: str | None = None,
    ):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
            raise UserError(
                f"checkpoint keep must be an integer >= 0 (got {keep!r}); 0 keeps every checkpoint"
            )
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.run_identity = run_identity
        self.algorithm = algorithm

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step}"

    # ----------------------------------------------------------------- discovery

    def committed_steps(self) -> list[int]:
        """Committed steps, ascending. Step directories without the marker are skipped
        with a warning (a save that crashed after the rename cannot happen; someone else
        made them)."""
        if not self.root.is_dir():
            return []
        steps = []
        for entry in sorted(self.root.iterdir()):
            match = _STEP_DIR.match(entry.name)
            if not match or not entry.is_dir():
                continue
            if (entry / COMMIT_MARKER).is_file():
                steps.append(int(match.group(1)))
            else:
                log.warning("ignoring checkpoint %s: no %s marker", entry, COMMIT_MARKER)
        return sorted(steps)

    def latest_committed(self) -> int | None:
        steps = self.committed_steps()
        return steps[-1] if steps else None

    def read_meta(self, step: int) -> dict[str, Any]:
        path = self.step_dir(step) / META_FILE
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.step_dir(step)}: cannot read {META_FILE}: {exc}")
        if meta.get("step") != step:
            raise CheckpointError(
                f"checkpoint {self.step_dir(step)}: {META_FILE} says step {meta.get('step')!r}"
            )
        return meta

    # ----------------------------------------------------------------- save

    def save(
        self,
        step: int,
        components: dict[str, Component],
        extra_meta: dict[str, Any] | None = None,
    ) -> Path:
        """Write and commit ``step_<step>/`` (collective), then prune. Returns its path."""
        rank, world = _rank_and_world()
        wrapped = {name: _as_component(c) for name, c in components.items()}
        problems = [f"bad component name {n!r}" for n in wrapped if not _COMPONENT_NAME.match(n)]
        to_save: dict[str, Any] = {}
        for name, comp in wrapped.items():
            try:
                if isinstance(comp, PlainState):
                    flat = encode_plain(comp.capture())
                    to_save[name] = {f"rank{rank}": flat} if comp.per_rank else flat
                else:
                    to_save[name] = comp.state_dict()
            except TypeError as exc:
                problems.append(f"component {name!r}: {exc}")
        try:
            meta_text = json.dumps(extra_meta or {})
        except (TypeError, ValueError) as exc:
            problems.append(f"extra_meta is not JSON-serialisable: {exc}")
        final = self.step_dir(step)
        if rank == 0 and (final / COMMIT_MARKER).exists():
            problems.append(f"{final} is already committed; a step is saved once")
        problems = _agree(problems)
        if problems:
            raise CheckpointError(f"cannot save checkpoint {final}: " + "; ".join(problems))

        nonce = _from_rank0(secrets.token_hex(4) if rank == 0 else None)
        tmp = self.root / f"step_{step}.tmp-{nonce}"
        if rank == 0:
            tmp.mkdir(parents=True)
        _barrier()
        try:
            with _quiet_single_process():
                dcp.save(
                    to_save,
                    storage_writer=dcp.FileSystemWriter(str(tmp)),
                    no_dist=_single_process(),
                )
        except (CheckpointException, OSError, RuntimeError, ValueError) as exc:
            # DCP gathers failures to every rank, so all ranks raise here together, after every
            # rank has stopped writing. Remove the partial files: on a full disk they would keep
            # the next save (a preemption save, say) from fitting either.
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"writing checkpoint {final} failed: {describe_dcp_failure(exc)}"
                f"{_disk_space_hint(self.root, to_save, exc)}; the partial {tmp.name} was removed "
                "and earlier checkpoints are intact"
            ) from None
        _barrier()

        error = None
        if rank == 0:
            # Any failure must reach the other ranks, or they would wait in the broadcast.
            try:
                self._commit(tmp, final, step, world, wrapped, json.loads(meta_text))
            except Exception as exc:
                error = f"committing {final} failed ({type(exc).__name__}: {exc}); earlier checkpoints are intact"
            else:
                try:
                    self.prune()
                except Exception as exc:
                    error = f"{final} is committed, but pruning old checkpoints failed: {type(exc).__name__}: {exc}"
        error = _from_rank0(error)
        if error:
            raise CheckpointError(error)
        return final

    def _commit(self, tmp, final, step, world, wrapped, extra) -> None:
        meta = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "world_size": world,
            "run_identity": self.run_identity,
            "algorithm": self.algorithm,
            "components": {
                name: (
                    {"kind": "plain", "per_rank": comp.per_rank}
                    if isinstance(comp, PlainState)
                    else {"kind": type(comp).__name__}
                )
                for name, comp in wrapped.items()
            },
            "files": _file_sizes(tmp),
            "saved_unix": time.time(),
            "extra": extra,
        }
        for rel in meta["files"]:
            _fsync_file(tmp / rel)
        _write_durably(tmp / META_FILE, json.dumps(meta, indent=1, sort_keys=True))
        _write_durably(tmp / COMMIT_MARKER, f"{step}\n")
        _fsync_file(tmp)
        if final.exists():  # a marker-less leftover; never a committed one (checked earlier)
            final.rename(self.root / f"step_{step}.deleting-{secrets.token_hex(4)}")
        tmp.rename(final)
        _fsync_file(self.root)

    # ----------------------------------------------------------------- prune

    def prune(self) -> list[int]:
        """Remove committed checkpoints beyond the newest ``keep`` and scratch directories of
        crashed saves. Rank 0 does the work; returns the removed steps."""
        rank, _ = _rank_and_world()
        if rank != 0 or not self.root.is_dir():
            return []
        steps = self.committed_steps()
        doomed = steps[: -self.keep] if self.keep > 0 else []
        for step in doomed:
            # Rename first so a crash mid-delete never leaves a half-deleted "committed" step.
            trash = self.root / f"step_{step}.deleting-{secrets.token_hex(4)}"
            self.step_dir(step).rename(trash)
        for entry in self.root.iterdir():
            if _SCRATCH_DIR.match(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
        return doomed

    # ----------------------------------------------------------------- load

    def _local_problems(
        self, step: int, wrapped: dict[str, Stateful | PlainState]
    ) -> tuple[list[str], dict[str, Any]]:
        """What stops this rank from loading ``step`` (empty if nothing) and the templates
        DCP loads into. Reads only metadata, never mutates the components."""
        rank, world = _rank_and_world()
        path = self.step_dir(step)
        if not (path / COMMIT_MARKER).is_file():
            return [f"{path} is not a committed checkpoint (no {COMMIT_MARKER})"], {}
        try:
            meta = self.read_meta(step)
        except CheckpointError as exc:
            return [str(exc)], {}
        problems = []
        for rel, size in meta.get("files", {}).items():
            file = path / rel
            if not file.is_file():
                problems.append(f"file {rel} is missing")
            elif file.stat().st_size != size:
                problems.append(f"file {rel} has {file.stat().st_size} bytes, expected {size}")
        if self.run_identity and meta.get("run_identity") not in (None, self.run_identity):
            problems.append(
                f"it belongs to run {meta.get('run_identity')!r}, not {self.run_identity!r}"
            )
        if problems:
            return problems, {}
        try:
            metadata = read_dcp_metadata(path)
        except Exception as exc:  # DCP raises assorted types for a damaged .metadata
            return [f"cannot read DCP metadata: {type(exc).__name__}: {exc}"], {}
        saved = metadata.state_dict_metadata

        templates: dict[str, Any] = {}
        for name, comp in wrapped.items():
            if name not in meta.get("components", {}):
                problems.append(f"component {name!r} was not saved (has: {sorted(meta.get('components', {}))})")
                continue
            if isinstance(comp, PlainState):
                if comp.per_rank and meta["world_size"] != world:
                    problems.append(
                        f"component {name!r} is per-rank and was saved by {meta['world_size']} "
                        f"ranks; this run has {world}"
                    )
                    continue
                prefix = _plain_prefix(name, comp, rank)
                flat = {}
                for key, md in saved.items():
                    if key.startswith(prefix):
                        if not isinstance(md, TensorStorageMetadata):
                            problems.append(f"component {name!r}: {key} is not a tensor")
                            continue
                        flat[key[len(prefix):]] = torch.empty(md.size, dtype=md.properties.dtype)
                if "json" not in flat:
                    problems.append(f"component {name!r}: no entries under {prefix}")
                    continue
                templates[name] = {f"rank{rank}": flat} if comp.per_rank else flat
                continue
            template = comp.state_dict()
            want = {f"{name}.{k}" for k in _flat_keys(template)}
            have = {k for k in saved if k.startswith(f"{name}.")}
            if want - have:
                problems.append(
                    f"component {name!r}: keys missing from the checkpoint: "
                    + _short_list(sorted(want - have))
                )
            if have - want:
                problems.append(
                    f"component {name!r}: checkpoint keys this run does not expect: "
                    + _short_list(sorted(have - want))
                )
            templates[name] = template
        return problems, templates

    def check_loadable(self, step: int, components: dict[str, Component]) -> None:
        """Raise ``CheckpointError`` if ``step`` cannot be loaded into ``components``
        (collective; components are not modified)."""
        wrapped = {name: _as_component(c) for name, c in components.items()}
        problems, _ = self._local_problems(step, wrapped)
        problems = _agree(problems)
        if problems:
            raise CheckpointError(f"checkpoint {self.step_dir(step)}: " + "; ".join(problems))

    def set_aside(self, step: int) -> Path:
        """Rename a committed but unloadable ``step_<N>/`` to ``step_<N>.unloadable-<nonce>/`` (collective).

        Resuming from an older step re-runs the steps after it, and a step is saved once; the
        damaged directory is kept (never deleted) for inspection, and nothing counts it any more.
        """
        rank, _ = _rank_and_world()
        nonce = _from_rank0(secrets.token_hex(4) if rank == 0 else None)
        target = self.root / f"step_{step}.unloadable-{nonce}"
        if rank == 0:
            self.step_dir(step).rename(target)
        _barrier()
        return target

    def latest_loadable(self, components: dict[str, Component]) -> int | None:
        """The newest committed step that passes ``check_loadable``; older ones are tried
        only after a logged warning saying why the newer one was refused. ``None`` when
        nothing was ever committed; ``CheckpointError`` naming every reason when checkpoints
        exist but none is loadable (never a silent restart from scratch)."""
        steps = self.committed_steps()
        reasons = []
        for step in reversed(steps):
            try:
                self.check_loadable(step, components)
                return step
            except CheckpointError as exc:
                log.warning("skipping checkpoint step %d: %s", step, exc)
                reasons.append(str(exc))
        if steps:
            raise CheckpointError(
                f"none of the {len(steps)} committed checkpoints under {self.root} can be "
                "loaded: " + " | ".join(reasons)
            )
        return None

    def load(self, step: int, components: dict[str, Component]) -> dict[str, Any]:
        """Load ``step`` into ``components`` in place (collective). Returns its meta.json."""
        path = self.step_dir(step)
        wrapped = {name: _as_component(c) for name, c in components.items()}
        problems, templates = self._local_problems(step, wrapped)
        problems = _agree(problems)
        if problems:
            raise CheckpointError(f"checkpoint {path}: " + "; ".join(problems))
        load_dcp(templates, path)
        rank, _ = _rank_and_world()
        for name, comp in wrapped.items():
            try:
                if isinstance(comp, PlainState):
                    flat = templates[name][f"rank{rank}"] if comp.per_rank else templates[name]
                    comp.restore(decode_plain(flat))
                else:
                    comp.load_state_dict(templates[name])
            except CheckpointError as exc:
                raise CheckpointError(f"checkpoint {path}, component {name!r}: {exc}") from exc
        return self.read_meta(step)
