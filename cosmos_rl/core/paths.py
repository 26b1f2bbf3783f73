"""How a manifest's path values are read: relative to the manifest's folder.

Its own module, below the judge (`preflight`) and the loader, so readers of data (`data/scan.py`)
resolve a path the way the run does without importing the judge.
"""

from __future__ import annotations

import os
from pathlib import Path


def resolve_path(value: str, base_dir: Path) -> str:
    """Manifest paths are relative to the manifest's folder; URLs and absolute paths pass through."""
    if not value or "://" in value or value.startswith("preset:") or os.path.isabs(value):
        return value
    return str((base_dir / value).resolve())
