"""The problem collector every preflight module writes to, and the rule helpers they share."""

from __future__ import annotations

import os
from pathlib import Path

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.problems import Problem
from cosmos_rl.data.tar_index import shard_names

# Seeds are TOML integers, 64-bit signed (tomllib reads larger ones anyway); the synthetic generator
# needs them non-negative.
SEED_MAX = 2**63 - 1


class Rules:
    """Collects problems; small helpers keep each rule one readable line."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.problems: list[Problem] = []

    def error(self, path: str, problem: str, got=..., fix: str = "") -> None:
        self.problems.append(Problem(path, problem, fix=fix) if got is ... else Problem(path, problem, got, fix))

    def warn(self, path: str, problem: str, got=..., fix: str = "") -> None:
        kw = {} if got is ... else {"got": got}
        self.problems.append(Problem(path, problem, fix=fix, severity="warning", **kw))

    def at_least(self, path: str, value, low, fix_hint: str = "") -> None:
        if value < low:
            self.error(path, f"must be >= {low}", value, fix_hint or f"set {path} to {low} or more")

    def positive(self, path: str, value) -> None:
        if not value > 0:
            self.error(path, "must be > 0", value, f"set {path} to a positive number")

    def local_path(self, path: str, value: str, *, kind: str) -> Path | None:
        """Resolve a manifest path relative to the manifest's folder; report it when missing."""
        if not value or "://" in value:
            return None
        resolved = Path(value) if os.path.isabs(value) else self.base_dir / value
        exists = resolved.is_dir() if kind == "folder" else resolved.exists() if kind == "any" else resolved.is_file()
        if not exists:
            self.error(path, f"{kind} not found: {resolved}", value, "fix the path (relative paths are read from the manifest's folder)")
            return None
        return resolved

    def shard_files(self, path: str, value: str) -> None:
        """Every local shard a path or brace pattern (``::`` joins several) names must be a file, so a
        run whose shards were never written stops here rather than after its launch; URLs are opened later."""
        try:
            names = shard_names([value])
        except UserError as exc:  # a brace range past the cap (counted, never expanded)
            self.error(path, str(exc), fix="name fewer shards (e.g. pairs-{000000..000099}.tar)")
            return
        local = [name.removeprefix("file:") for name in names if "://" not in name and not name.startswith("pipe:")]
        resolved = [Path(os.path.normpath(name if os.path.isabs(name) else self.base_dir / name)) for name in local]
        missing = [shard for shard in resolved if not shard.is_file()]
        if not missing:
            return
        found = f"file not found: {missing[0]}" if len(names) == 1 else f"{len(missing)} of {len(names)} shards not found, the first {missing[0]}"
        self.error(path, found, value, "write the shards first or fix the path (relative paths are read from the manifest's folder)")


def seed_rule(path: str, value: int, r: Rules) -> None:
    if not 0 <= value <= SEED_MAX:
        r.error(path, "must be in [0, 2**63 - 1], a non-negative 64-bit integer", value, "use e.g. 0")


def algorithm_name(rl) -> str:
    """How a rule names the algorithm: "NFT", "DPO" (an entry named by import string, as written)."""
    return rl.algorithm.upper() if ":" not in rl.algorithm else rl.algorithm
