"""The files of one checkpoint step: sizes and checksums recorded at save, checked at load. Torch-free.

A size check catches a truncated or missing file; a flipped byte that keeps the size (a bad
disk, a bad copy) is only caught by a checksum, so format version 2 records a SHA-256 per file
(hashlib's SHA-256 runs at several hundred MiB/s on one core, faster than blake2b on CPUs with
SHA instructions). The hashing is spread over the ranks: rank ``r`` of ``w`` takes every
``w``-th file of the sorted list (``share``), at save right after DCP wrote the files (still in
the page cache) and at load before DCP reads anything.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

CHECKSUM = "sha256"
_CHUNK = 1 << 20


def file_sizes(root: Path) -> dict[str, int]:
    """Every regular file under ``root`` (relative POSIX path) -> its size in bytes."""
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def share(names: list[str] | dict[str, Any], rank: int, world: int) -> list[str]:
    """This rank's part of the files to hash: every ``world``-th of the sorted names."""
    return sorted(names)[rank::world]


def digest(path: Path) -> str:
    # hashlib.file_digest is 3.11+; the package supports 3.10.
    hasher = hashlib.new(CHECKSUM)
    buffer = memoryview(bytearray(_CHUNK))
    with open(path, "rb", buffering=0) as f:
        while count := f.readinto(buffer):
            hasher.update(buffer[:count])
    return hasher.hexdigest()


def damaged_files(path: Path, meta: dict[str, Any], rank: int, world: int) -> list[str]:
    """What is wrong with the files of the step at ``path`` against its ``meta.json`` (empty when
    nothing): every file's presence and size, and the checksums of this rank's ``share``.
    A version-1 checkpoint recorded no checksums, so only its sizes are checked."""
    sizes = meta.get("files", {})
    problems = []
    for rel, size in sizes.items():
        file = path / rel
        if not file.is_file():
            problems.append(f"file {rel} is missing")
        elif file.stat().st_size != size:
            problems.append(f"file {rel} has {file.stat().st_size} bytes, expected {size}")
    if problems or meta.get("format_version") == 1:
        return problems
    algorithm, checksums = meta.get("checksum_algorithm"), meta.get("checksums", {})
    if algorithm != CHECKSUM:
        return [f"meta.json records checksum algorithm {algorithm!r}; this cosmos-rl checks {CHECKSUM!r}"]
    for rel in share(sizes, rank, world):
        if rel not in checksums:
            problems.append(f"file {rel} has no recorded checksum")
            continue
        try:
            actual = digest(path / rel)
        except OSError as exc:
            problems.append(f"file {rel} cannot be read: {exc}")
            continue
        if actual != checksums[rel]:
            problems.append(
                f"file {rel} is damaged: its {CHECKSUM} is {actual[:16]}..., "
                f"meta.json recorded {str(checksums[rel])[:16]}..."
            )
    return problems


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
