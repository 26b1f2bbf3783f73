"""Seeds derived from labelled parts: every random draw of a run comes from (job.seed, label, rank, ...).

Deriving rather than advancing a global generator is what makes a resumed run draw exactly what a
straight run draws, whatever happened before the resume point.
"""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from labelled parts, stable across processes, platforms and Python versions."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
