"""The one way a file the user names is opened: a regular file of bounded size, or a one-line refusal.

Every reader of a user's file (data rows and lists, images, clips, first frames, checkpoints'
metadata, caches, model folders' JSON, ``compare --base-eval``) opens it through
:func:`open_user_file` or the readers built on it, because ``open()`` alone trusts too much:

- a name holding a NUL byte makes ``open`` raise ``ValueError`` (a traceback, not a refusal), and a
  name that is not valid UTF-8 (a JSON ``"\\udc80"``, a lone surrogate) raises ``UnicodeEncodeError``
  or cannot be printed in an error: both are refused by name, before the filesystem is asked;
- a FIFO blocks ``open`` until a writer comes (forever), and a device (``/dev/zero``) reads without
  end: the file is opened with ``O_NONBLOCK`` (a FIFO opens at once), then anything that is not a
  regular file is refused, and the flag is cleared again for the reads;
- a regular file larger than the reader's ``limit`` is refused from its size before any byte is read,
  and :func:`read_user_bytes` reads at most ``limit + 1`` bytes, so a file that grows while read is
  refused too instead of filling memory.

Each refusal is a ``UserError``: ``{origin}: {what} {path} ...; {fix}``, where ``origin`` names the
key or ``file:line`` that gave the path (empty: the message starts with ``what``).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO, Union

from cosmos_rl.core.errors import UserError

KiB, MiB = 1 << 10, 1 << 20
# Metadata: a tar shard's json/txt member, a checkpoint's meta.json, a model folder's config. Real
# ones are a few KiB; the cap is far above that and far below what could hurt memory.
MAX_METADATA_BYTES = 1 * MiB
# A JSON document a command reads whole (an eval.json with one row per prompt, a cache entry).
MAX_JSON_BYTES = 64 * MiB
# A line-oriented data list (a preference JSONL, a prompt file): ~1 M rows of a few hundred bytes.
MAX_TEXT_BYTES = 512 * MiB
# An mp4's bytes (a file, or a tar member read whole). Training clips are tens of frames (a
# lossless 33-frame 720p clip is ~30-60 MB); a member declaring more is refused before it is read.
# Here rather than in data/clip_files.py (which re-exports it) so that the tar index and the
# preflight that read the limit do not import PyAV with the decoder.
MAX_CLIP_BYTES = 256 << 20

PathLike = Union[str, os.PathLike]


def shown(path: PathLike) -> str:
    """The path as it can be printed on one line (NUL and undecodable bytes escaped)."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def name_problem(path: PathLike) -> str | None:
    """Why the name itself cannot be a file's name, or None."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\x00" in text:
        return "holds a NUL byte, which no file name can"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (undecodable bytes or a lone surrogate)"
    return None


def check_name(path: PathLike, origin: str, what: str = "file") -> Path:
    """``path`` as a Path, or a UserError naming ``origin`` when the name cannot name a file."""
    problem = name_problem(path)
    if problem is not None:
        raise UserError(f"{_at(origin)}the {what} name {shown(path)!r} {problem}; give a UTF-8 path without control bytes")
    return Path(os.fspath(path) if not isinstance(path, bytes) else os.fsdecode(path))


def _at(origin: str) -> str:
    return f"{origin}: " if origin else ""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_user_file(path: PathLike, origin: str, what: str, limit: int) -> BinaryIO:
    """The file opened for binary reading, after the checks of the module docstring; the caller closes it.

    ``what`` names the file's role ("clip file", "checkpoint metadata"); ``limit`` is the most bytes
    that role can need.
    """
    path = check_name(path, origin, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise UserError(f"{_at(origin)}{what} not found: {shown(path)}; check the path") from None
        raise UserError(f"{_at(origin)}{what} {shown(path)} cannot be opened ({exc.strerror or exc}); check the path") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{_at(origin)}{what} {shown(path)} is {_kind(info.st_mode)}, not a regular file; name a regular file")
        if info.st_size > limit:
            raise UserError(f"{_at(origin)}{what} {shown(path)} is {info.st_size} bytes, over the {limit}-byte limit for a "
                            f"{what}; it is not one (or is damaged): check the path")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_user_bytes(path: PathLike, origin: str, what: str, limit: int) -> bytes:
    """The whole file, at most ``limit`` bytes (a file that grew past it while read is refused)."""
    with open_user_file(path, origin, what, limit) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UserError(f"{_at(origin)}{what} {shown(path)} cannot be read ({exc.strerror or exc}); check the file") from None
    if len(data) > limit:
        raise UserError(f"{_at(origin)}{what} {shown(path)} grew past the {limit}-byte limit for a {what} while read; check the file")
    return data


def read_user_text(path: PathLike, origin: str, what: str, limit: int) -> str:
    """The file as UTF-8 text (see :func:`read_user_bytes`)."""
    data = read_user_bytes(path, origin, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{_at(origin)}{what} {shown(path)} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def parse_json(data: Union[bytes, str], origin: str, what: str) -> object:
    """JSON text parsed, or one line naming ``origin``: malformed, not UTF-8, nested too deeply."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise UserError(f"{_at(origin)}{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); fix or regenerate it") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{_at(origin)}{what} is not UTF-8 ({exc.reason}); fix or regenerate it") from None
    except RecursionError:
        raise UserError(f"{_at(origin)}{what} is JSON nested too deeply to read; fix or regenerate it") from None


def read_user_json(path: PathLike, origin: str, what: str, limit: int = MAX_JSON_BYTES) -> object:
    """The file parsed as JSON (see :func:`read_user_bytes` and :func:`parse_json`)."""
    return parse_json(read_user_text(path, origin, what, limit), origin, f"{what} {shown(path)}")
