"""Bounded, safe reads of the files of a LeRobot-format dataset folder (:mod:`cosmos_rl.data.lerobot`).

A dataset folder is user input, so every file in it is opened here and nowhere else:

- a path with a NUL byte is refused before the filesystem sees it (Python would raise a bare
  ``ValueError``), and so is a path a template in ``meta/info.json`` makes that leaves the folder;
- only regular files are read: a FIFO would block forever and a device never end. The file is opened
  non-blocking and checked with ``fstat`` on the open descriptor, so a file swapped for a FIFO after
  a ``stat`` is still refused;
- metadata (JSON, the task and episode tables) is read whole up to a size cap, JSON with a nesting
  limit and no NaN or Infinity; data tables are opened lazily and only the columns and row groups an
  episode needs are read, with their uncompressed size capped before anything is decompressed.

Nothing read runs code: JSON and parquet only (pyarrow reads no pickled pandas objects).
Every refusal is a :class:`DatasetError`: one line naming the file (and the episode), the problem
and the fix.
"""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from cosmos_rl.core.errors import UserError, library_text

MAX_JSON_BYTES = 16 << 20  # info.json and stats.json: a few KiB in real datasets
MAX_TABLE_BYTES = 256 << 20  # meta/ tables (tasks, episodes), read whole
MAX_READ_BYTES = 1 << 30  # the uncompressed columns one episode's read of a data table may decode
MAX_JSON_DEPTH = 64
REWRITE = "restore the file from the dataset's source or write the dataset again"


class DatasetError(UserError):
    """One problem of a dataset folder: `path: problem; fix` (the path names the file, and the episode)."""

    def __init__(self, path: str, problem: str, fix: str = REWRITE, episode: Optional[int] = None):
        self.file, self.problem, self.fix, self.episode = path, problem, fix, episode
        self.path = path if episode is None else f"{path} (episode {episode})"
        super().__init__(f"{self.path}: {problem}; {fix}")

    def of_episode(self, episode: int) -> "DatasetError":
        """The same problem, naming the episode whose read found it."""
        return self if self.episode is not None else DatasetError(self.file, self.problem, self.fix, episode)


def shown(path) -> str:
    """A path as one printable line (a NUL or a newline in a name would break the message)."""
    text = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def inside(root: Path, relative: str, what: str) -> Path:
    """`root / relative` for a path a dataset's own metadata names; refused when it leaves the folder."""
    if "\x00" in relative:
        raise DatasetError(shown(root / relative), f"{what} has a NUL byte in its path", "fix the path template in meta/info.json")
    parts = Path(relative).parts
    if Path(relative).is_absolute() or ".." in parts or not parts:
        raise DatasetError(shown(root / "meta/info.json"), f"{what} path {shown(relative)!r} leaves the dataset folder",
                           "give a path relative to the folder, without '..'")
    return root / relative


def _open_regular(path: Path, what: str) -> tuple[int, int]:
    """(descriptor, size) of a regular file opened for reading, or a DatasetError."""
    if "\x00" in str(path):
        raise DatasetError(shown(path), f"{what}: a NUL byte in the path", "give the path without it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DatasetError(shown(path), f"{what} not found", REWRITE if _dataset_file(path) else "check the path") from None
    except OSError as exc:
        raise DatasetError(shown(path), f"{what}: cannot open ({exc.strerror or exc})", "check the path and its permissions") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise DatasetError(shown(path), f"{what} is not a regular file (a folder, FIFO or device)", "replace it with the file itself")
    os.set_blocking(fd, True)
    return fd, info.st_size


def _dataset_file(path: Path) -> bool:
    return any(part in ("meta", "data", "videos") for part in path.parts)


def read_bytes(path: Path, what: str, cap: int) -> bytes:
    """A whole regular file of at most `cap` bytes."""
    fd, size = _open_regular(path, what)
    with os.fdopen(fd, "rb") as handle:
        if size > cap:
            raise DatasetError(shown(path), f"{what} is {size} bytes, over the {cap}-byte limit for it", REWRITE)
        data = handle.read(cap + 1)  # the size may have grown since fstat
    if len(data) > cap:
        raise DatasetError(shown(path), f"{what} is over the {cap}-byte limit for it", REWRITE)
    return data


def open_binary(path: Path, what: str):
    """A regular file opened for reading (a video or a data table, read in part by its reader)."""
    fd, _ = _open_regular(path, what)
    return os.fdopen(fd, "rb")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _depth(value, limit: int) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_json(text: bytes, origin: str):
    """A JSON document (UTF-8, finite numbers, at most MAX_JSON_DEPTH deep) or a DatasetError naming `origin`."""
    try:
        value = json.loads(text.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise DatasetError(origin, "not UTF-8 text") from None
    except RecursionError:
        raise DatasetError(origin, f"JSON nested too deeply to read (the limit is {MAX_JSON_DEPTH})") from None
    except ValueError as exc:  # JSONDecodeError included
        raise DatasetError(origin, f"not valid JSON ({library_text(exc)})") from None
    if _depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise DatasetError(origin, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json(path: Path, what: str):
    return parse_json(read_bytes(path, what, MAX_JSON_BYTES), shown(path))


def read_jsonl(path: Path, what: str) -> list:
    """The rows of a JSON-lines file (v2.1's meta/episodes.jsonl and meta/tasks.jsonl); blank lines skipped."""
    data = read_bytes(path, what, MAX_TABLE_BYTES)
    rows = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            rows.append(parse_json(line, f"{shown(path)}:{number}"))
    return rows


def _parquet_error(path: Path, what: str, exc: Exception) -> DatasetError:
    return DatasetError(shown(path), f"{what}: not a readable parquet table ({library_text(exc)})")


def read_table(path: Path, what: str, columns: Optional[Sequence[str]] = None) -> pa.Table:
    """A whole metadata table (at most MAX_TABLE_BYTES on disk and uncompressed)."""
    data = read_bytes(path, what, MAX_TABLE_BYTES)
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        missing = [c for c in columns or () if c not in parquet.schema_arrow.names]
        if missing:
            raise DatasetError(shown(path), f"{what} has no column(s) {', '.join(missing)}")
        if parquet.metadata.num_row_groups and _uncompressed(parquet, range(parquet.metadata.num_row_groups), columns) > MAX_TABLE_BYTES:
            raise DatasetError(shown(path), f"{what} decompresses to over {MAX_TABLE_BYTES} bytes", REWRITE)
        return parquet.read(columns=list(columns) if columns is not None else None)
    except DatasetError:
        raise
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise _parquet_error(path, what, exc) from None


def _uncompressed(parquet: pq.ParquetFile, groups, columns: Optional[Sequence[str]]) -> int:
    meta = parquet.metadata
    wanted = None if columns is None else set(columns)
    total = 0
    for group in groups:
        row_group = meta.row_group(group)
        for column in range(row_group.num_columns):
            chunk = row_group.column(column)
            name = chunk.path_in_schema  # a leaf: "action.list.element" for the list column "action"
            if wanted is None or any(name == c or name.startswith(c + ".") for c in wanted):
                total += chunk.total_uncompressed_size
    return total


def read_rows(path: Path, what: str, columns: Sequence[str], key: str, value: int) -> pa.Table:
    """The rows of a data table whose `key` column equals `value` (one episode), reading only the
    row groups whose statistics may hold it and only `columns`; the decoded size is capped first."""
    with open_binary(path, what) as handle:
        try:
            parquet = pq.ParquetFile(handle)
            names = set(parquet.schema_arrow.names)
            missing = [c for c in list(columns) + [key] if c not in names]
            if missing:
                raise DatasetError(shown(path), f"{what} has no column(s) {', '.join(missing)} (found {', '.join(sorted(names))})")
            groups = _groups_holding(parquet, key, value)
            wanted = list(dict.fromkeys(list(columns) + [key]))
            if _uncompressed(parquet, groups, wanted) > MAX_READ_BYTES:
                raise DatasetError(shown(path), f"{what}: one episode's rows decompress to over {MAX_READ_BYTES} bytes")
            table = parquet.read_row_groups(groups, columns=wanted) if groups else parquet.schema_arrow.empty_table().select(wanted)
        except DatasetError:
            raise
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as exc:
            raise _parquet_error(path, what, exc) from None
    import pyarrow.compute as pc

    try:
        return table.filter(pc.equal(table[key], value))
    except pa.ArrowException as exc:
        raise _parquet_error(path, what, exc) from None


def _groups_holding(parquet: pq.ParquetFile, key: str, value: int) -> list[int]:
    meta = parquet.metadata
    leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
    index = leaves.index(key) if key in leaves else None  # a list column has no min/max to skip by
    groups = []
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(index).statistics if index is not None else None
        if stats is not None and stats.has_min_max and isinstance(stats.min, int) and not stats.min <= value <= stats.max:
            continue
        groups.append(group)
    return groups


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def table_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
