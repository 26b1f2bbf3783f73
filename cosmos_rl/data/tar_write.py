"""Writing webdataset tar shards the same way everywhere: fixed member metadata, PNG images and a
shard that only gets its final name once complete.

Members carry mtime 0, mode 0644 and owner 0, so the same content always gives byte-identical
files; a shard is written as `<name>.partial` and renamed when closed, so a reader globbing
`*.tar` never sees one cut short.
"""

from __future__ import annotations

import io
import os
import tarfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from cosmos_rl.core.errors import UserError


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def png_bytes(image: np.ndarray) -> bytes:
    """uint8 [H, W, 3] as PNG bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def refuse_existing(out: Path, prefix: str) -> None:
    """A folder that already holds `<prefix>-*.tar` would mix an old set into the new one."""
    old = sorted(out.glob(f"{prefix}-*.tar"))
    if old:
        raise UserError(f"{old[0]}: shards named {prefix}-*.tar already exist in {out}; "
                        "write to an empty folder or delete the old set first")


@contextmanager
def shard(path: Path) -> Iterator[tarfile.TarFile]:
    """An uncompressed USTAR shard at `path`, renamed from `path.partial` once closed."""
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.USTAR_FORMAT) as tar:
        yield tar
    os.replace(partial, path)
