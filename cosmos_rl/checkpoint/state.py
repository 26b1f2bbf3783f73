"""What a checkpoint component can be: live state captured at save and set back at load.

* ``ModelState`` / ``OptimizerState`` wrap ``torch.distributed.checkpoint.state_dict`` so
  FSDP2 shards save sharded and load with resharding onto any world size.
* ``PlainState`` (or a plain ``dict``) holds ints/floats/strings/bools/None/lists/dicts and
  tensors: the non-tensor part is stored as UTF-8 JSON bytes in a uint8 tensor
  (``encode_plain``), so nothing is ever unpickled on load. ``RngStreams`` (every global RNG
  stream of a rank) and ``LRScheduleState`` (an LR scheduler's counters) are built on it.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_rl.checkpoint.layout import CheckpointError

_TENSOR_REF = "__tensor__"
_LIST_LIMIT = 10

Component = Any  # Stateful (ModelState, OptimizerState, ...), PlainState or a plain dict


def short_list(items: list[str]) -> str:
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
    """Inverse of ``encode_plain``. Bytes that do not decode (a damaged checkpoint) raise
    ``CheckpointError``, which a resume treats like any other damage."""

    def restore(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_TENSOR_REF}:
                return flat[f"t{value[_TENSOR_REF]}"]
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    try:
        doc = json.loads(bytes(flat["json"].tolist()).decode("utf-8"))
        data = restore(doc)
    except (KeyError, TypeError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"plain state does not decode ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"plain state decodes to a {type(data).__name__}, not a dict")
    return data


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
            problems.append(f"keys the model does not have: {short_list(unexpected)}")
        if not_loaded or absent:
            problems.append(f"keys not loaded: {short_list(sorted(set(not_loaded + absent)))}")
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


def as_component(value: Component) -> Stateful | PlainState:
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


class CursorState(PlainState):
    """A data cursor's position (any object with `state_dict` / `load_state_dict` of plain values)."""

    def __init__(self, cursor):
        super().__init__()
        self.cursor = cursor

    def capture(self) -> dict[str, Any]:
        return self.cursor.state_dict()

    def restore(self, data: dict[str, Any]) -> None:
        self.cursor.load_state_dict(data)
