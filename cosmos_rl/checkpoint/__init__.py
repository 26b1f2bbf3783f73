"""Run checkpoints (DCP with an atomic commit) and the safe readers of DCP folders.

Modules, one concern each:

* ``layout``: step directories, the commit marker, ``meta.json``, scanning, the cadence rule
  and the component names every trainer saves under. Torch-free.
* ``integrity``: file sizes and checksums recorded at save and checked at load. Torch-free.
* ``state``: what a component can be (``ModelState``, ``OptimizerState``, ``PlainState``,
  ``RngStreams``, ``LRScheduleState``) and the pickle-free plain encoding.
* ``policy``: the trained weights as every trainer saves them (``AdapterState`` for a LoRA
  adapter, every weight otherwise), ``policy_component`` choosing between the two.
* ``dcp_io``: reading DCP folders without running code (the ``.metadata`` index, byte entries).
* ``collective``: the few collectives a save or load needs.
* ``loading``: the templates DCP reads a step into, checked against its index.
* ``weight_files``: what every loader of a model folder checks before building anything: bounded
  configs, safetensors headers read alone, an index's files inside its folder, the config's meta
  build against the weights. Torch-free.
* ``manager``: ``CheckpointManager``: save, commit, prune, load and ``resume_latest``.

Importing this package, or ``cosmos_rl.checkpoint.layout``, does not import torch: the names
below that need torch are resolved on first access (PEP 562 module ``__getattr__``), so
``from cosmos_rl.checkpoint import CheckpointManager`` still works and torch-free callers
(``run.py``, ``report.py``, the NFT driver) pay nothing for it.
"""

from __future__ import annotations

import importlib
from typing import Any

from cosmos_rl.checkpoint.layout import (
    COMPONENTS,
    FORMAT_VERSION,
    CheckpointError,
    CheckpointWriteError,
    checkpoint_due,
    committed_steps,
    latest_committed,
)

# name -> the submodule that defines it (imported on first access: they import torch)
_LAZY = {
    "CheckpointManager": "manager",
    "Selection": "manager",
    "ModelState": "state",
    "OptimizerState": "state",
    "PlainState": "state",
    "RngStreams": "state",
    "LRScheduleState": "state",
    "encode_plain": "state",
    "AdapterState": "policy",
    "policy_component": "policy",
    "decode_plain": "state",
    "load_dcp": "dcp_io",
    "read_dcp_metadata": "dcp_io",
    "SafeFileSystemReader": "dcp_io",
}

__all__ = [
    "COMPONENTS",
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointWriteError",
    "checkpoint_due",
    "committed_steps",
    "latest_committed",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
