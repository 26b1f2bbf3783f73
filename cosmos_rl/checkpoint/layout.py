"""Where a run's checkpoints live, which of them count, and what they are called. Torch-free.

``run.py``, ``report.py`` and the NFT driver read checkpoints through this module without
importing torch; the manager (``checkpoint.manager``) writes what it describes.

Layout under ``<run_dir>/checkpoints/``::

    step_<N>/                   a committed checkpoint (only once ``COMMITTED`` exists)
        .metadata, *.distcp     the DCP checkpoint (every component, one key namespace each)
        meta.json               format version, step, world size, run identity, algorithm,
                                components, file sizes and (version 2) file checksums
        COMMITTED               written last; a directory without it never counts
    step_<N>.tmp-<nonce>/       a save in progress (or one that crashed); never read
    step_<N>.deleting-<nonce>/  a pruned checkpoint being removed
    step_<N>.unloadable-<nonce>/ a committed checkpoint a resume could not load, kept for inspection
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from cosmos_rl.core.errors import RunFailed, UserError
from cosmos_rl.core.files import MAX_METADATA_BYTES, read_user_json

log = logging.getLogger(__name__)

# 1: the first format (per-trainer component names, file sizes only).
# 2: one set of component names (COMPONENTS) and a checksum per file.
FORMAT_VERSION = 2
CHECKPOINTS = "checkpoints"
META_FILE = "meta.json"
COMMIT_MARKER = "COMMITTED"
STEP_DIR = re.compile(r"^step_(0|[1-9][0-9]*)$")
SCRATCH_DIR = re.compile(r"^step_[0-9]+\.(tmp|deleting)-[0-9a-f]+$")

# The component names every trainer saves under (the keys of meta.json's "components" and the
# prefixes of the DCP keys). A trainer saves the subset it has: DPO has no `old`, and saves
# `data_cursor` only when rl.data.cursor_resume.
POLICY = "policy"  # the trained weights: LoRA adapter tensors, or every weight of a full fine-tune
OLD = "old"  # NFT's moving old-policy adapter
EMA = "ema"  # GRPO's moving average of the policy adapter (rl.ema_decay): the run's model when present
OPTIMIZER = "optimizer"
LR_SCHEDULE = "lr_schedule"
DATA_CURSOR = "data_cursor"  # the position in the data stream (DPO pairs, NFT prompts)
PROGRESS = "progress"  # {"step": N}
RNG = "rng"  # every rank's RNG streams (per rank)
PENDING_ROLLOUT = "pending_rollout"  # rl.async_reward: each rank's rollout of the next step, made before this step's learn (per rank)
COMPONENTS = (POLICY, OLD, EMA, OPTIMIZER, LR_SCHEDULE, DATA_CURSOR, PROGRESS, RNG, PENDING_ROLLOUT)

# What format version 1 called a component that has a new name: DPO saved `lr_schedule` and
# `pair_cursor`, NFT `schedule` and `cursor`. Read transparently from version-1 checkpoints.
LEGACY_NAMES = {LR_SCHEDULE: ("schedule",), DATA_CURSOR: ("pair_cursor", "cursor")}


class CheckpointError(UserError):
    """A checkpoint could not be saved or loaded; the message names the directory and keys."""


class CheckpointWriteError(RunFailed):
    """Writing or committing a checkpoint failed at run time (a full disk, a vanished mount): no
    mistake of the user's manifest, so the run exits 1 (not 2); earlier checkpoints are intact."""


def checkpoint_due(step: int, max_steps: int, every: int) -> bool:
    """The cadence rule of `checkpoint.every`: every `every` steps (0 = never) and always the last."""
    return step == max_steps or (every > 0 and step % every == 0)


def checkpoints_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def committed_steps(root: str | os.PathLike) -> list[int]:
    """Committed steps under a ``checkpoints/`` folder, ascending.

    A ``step_<N>/`` without the marker is skipped with a logged warning: a save never renames
    before committing, so someone else made it."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in sorted(root.iterdir()):
        match = STEP_DIR.match(entry.name)
        if not match or not entry.is_dir():
            continue
        if (entry / COMMIT_MARKER).is_file():
            steps.append(int(match.group(1)))
        else:
            log.warning("ignoring checkpoint %s: no %s marker", entry, COMMIT_MARKER)
    return sorted(steps)


def latest_committed(root: str | os.PathLike) -> int | None:
    steps = committed_steps(root)
    return steps[-1] if steps else None


def read_meta(root: Path, step: int) -> dict[str, Any]:
    """``meta.json`` of ``step_<step>/``; ``CheckpointError`` when it is unreadable, names
    another step or has a format this version does not read."""
    where = step_dir(root, step)
    try:
        # core.files: a FIFO or device in its place is refused (a plain read would block forever or
        # never end), and so is a file past MAX_METADATA_BYTES (real ones are a few KiB).
        meta = read_user_json(where / META_FILE, f"checkpoint {where}", f"{META_FILE}", MAX_METADATA_BYTES)
    except UserError as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {where}: {META_FILE} holds a {type(meta).__name__}, not an object")
    if meta.get("step") != step:
        raise CheckpointError(f"checkpoint {where}: {META_FILE} says step {meta.get('step')!r}")
    version = meta.get("format_version")
    if version not in range(1, FORMAT_VERSION + 1):
        raise CheckpointError(
            f"checkpoint {where}: {META_FILE} has format_version {version!r}; this cosmos-rl reads "
            f"versions 1 to {FORMAT_VERSION} (a newer cosmos-rl wrote it? resume with that version)"
        )
    return meta


def stored_name(meta: dict[str, Any], name: str) -> str:
    """The name component ``name`` was saved under: itself, or in a version-1 checkpoint the
    legacy name that checkpoint used for it (``schedule`` for ``lr_schedule``, ...)."""
    saved = meta.get("components", {})
    if name in saved or meta.get("format_version") != 1:
        return name
    return next((old for old in LEGACY_NAMES.get(name, ()) if old in saved), name)
