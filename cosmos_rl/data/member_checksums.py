"""SHA-256 checksums of the clip members the project writes into webdataset shards; torch-free.

H.264 carries no checksum and mp4 stores none, so a flipped bit inside a frame's slice data often
decodes without an error, to different pixels (docs/data.md "Clip files"). Every writer of clip
shards (:mod:`cosmos_rl.data.clip_shards`, `pairs mine`) therefore records each mp4 member's
SHA-256 in the sample's ``json`` member, under ``"sha256"``: ``{"<member extension>": "<64 hex>"}``
(``{"mp4": ...}`` for a clip-caption sample, ``{"winner.mp4": ..., "loser.mp4": ...}`` for a
pair). The readers (:mod:`cosmos_rl.data.tar_index`, :mod:`cosmos_rl.data.caption_index`, and so
training and ``validate --data``) verify a member's bytes against it when they read the member,
before decoding. A sample whose json records no ``sha256`` (older shards, a user's own) is read as
before, unverified.

The digest is of the member's bytes, so it is deterministic: the same clips still write
byte-identical shards.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping, Optional

from cosmos_rl.core.errors import UserError

FIELD = "sha256"
_HEX = re.compile(r"[0-9a-f]{64}")


def digest(data: bytes) -> str:
    """The lowercase hex SHA-256 of ``data``, as the writers record it."""
    return hashlib.sha256(data).hexdigest()


def recorded(row: Mapping[str, Any], members: Mapping[str, Any], origin: str) -> dict[str, str]:
    """The ``sha256`` field of a sample's json (member extension -> digest), checked: a mapping of
    members the sample holds to 64 lowercase hex digits; ``{}`` when the field is absent."""
    if FIELD not in row:
        return {}
    value = row[FIELD]
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) and _HEX.fullmatch(v) for k, v in value.items()):
        raise UserError(
            f"{origin}: json field {FIELD!r} must map member names (e.g. 'mp4', 'winner.mp4') to 64 lowercase hex "
            f"digits, found {_short(value)}; write the shards again, or drop the field to read them unverified"
        )
    missing = sorted(set(value) - set(members))
    if missing:
        raise UserError(
            f"{origin}: json field {FIELD!r} records a digest for {missing[0]!r}, a member the sample does not hold "
            f"(members: {', '.join(sorted(members))}); the shard was re-packed or damaged: write the shards again"
        )
    return dict(value)


def verify(data: bytes, expected: Optional[str], member: str, origin: str) -> None:
    """Refuse ``data`` (member ``member`` of the sample at ``origin``) when its SHA-256 is not the
    ``expected`` one its json records; nothing to check when ``expected`` is None."""
    if expected is None:
        return
    found = digest(data)
    if found != expected:
        raise UserError(
            f"{origin}: member {member!r} is damaged: its SHA-256 is {found}, the sample's json records {expected} "
            "(bytes changed on disk or in a copy; FFmpeg would decode it silently); write the shards again "
            "or copy them again from a good copy"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
