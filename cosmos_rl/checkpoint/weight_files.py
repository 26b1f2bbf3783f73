"""The checks every loader of a model folder makes before it builds anything from the folder.

A model folder (a Cosmos3 pipeline's `transformer/`, `vae/`, a CLIP reward's folder) is data
someone else wrote: its `config.json` decides how much memory building the model takes, and its
weight index decides which files are opened. So before a loader allocates a tensor it asks here:

* `read_config`: the config is a small JSON object (bounded size and nesting);
* `config_problem`: the config's sizes are integers within sane bounds, its scales finite and
  positive (a table of `Bound`s per model class, kept next to each loader);
* `folder_weight_shapes`: every tensor the folder's safetensors files declare, read from their
  headers only (a header's claimed length is checked against a cap and the file's size, and every
  tensor's bytes must lie inside the file), with the files named by a `*.safetensors.index.json`
  resolved inside the folder (no `..`, no absolute name, no symlink out of it);
* `shape_problem`: the model the config builds (on the meta device: no memory) holds only
  tensors the weights hold, at the same shapes; so what is then allocated is at most what the
  files hold on disk.

Every answer is a `FolderProblem` (a `ValueError`) whose text names the file, the key, what was
found and the fix; each loader prefixes the setting that named the folder and raises it as the
user's error. Nothing here runs code from a file: JSON and safetensors headers only, and this
module does not import torch (`meta_shapes` imports it when called).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from cosmos_rl.core.errors import library_text

# safetensors' own reader refuses headers over 100 MB; a real model's header is well under 10 MB.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# config.json, an index or a processor config: real ones are kilobytes (an index a few MB).
MAX_CONFIG_BYTES = 64 * 1024 * 1024
# How deep a config may nest: real ones are 3 levels; json recurses once per level.
MAX_NESTING = 32
SHOWN = 3  # differing keys listed in a message

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


class FolderProblem(ValueError):
    """A model folder that cannot be loaded as it is: one line naming the file, key, finding and fix."""


def shown(path: Path | str) -> str:
    """A path as messages show it: quoted, with control characters escaped."""
    return repr(str(path))


# ------------------------------------------------------------------------------ files and JSON
def _regular_size(path: Path, what: str) -> int:
    """The size of `path`, which must be a regular file (a FIFO or a device would block or never end)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise FolderProblem(f"{shown(path)}: {what} cannot be read ({type(exc).__name__}: {exc.strerror}); restore the file") from None
    if not stat.S_ISREG(info.st_mode):
        raise FolderProblem(f"{shown(path)}: {what} is not a regular file; replace it with the file itself")
    return info.st_size


def _depth(value, limit: int) -> int:
    depth, level = 0, [value]
    while level:
        depth += 1
        if depth > limit:
            return depth
        level = [v for item in level if isinstance(item, (dict, list)) for v in (item.values() if isinstance(item, dict) else item)]
    return depth


def read_config(path: Path, what: str = "config") -> dict:
    """A JSON object from a folder's config file: bounded in size and nesting, else FolderProblem."""
    path = Path(path)
    size = _regular_size(path, what)
    if size > MAX_CONFIG_BYTES:
        raise FolderProblem(f"{shown(path)}: {what} is {size} bytes, over the {MAX_CONFIG_BYTES}-byte cap for a config; use the model's own file")
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {exc}"
        raise FolderProblem(f"{shown(path)}: {what} is not valid JSON ({reason}); restore the file save_pretrained wrote") from None
    if not isinstance(data, dict):
        raise FolderProblem(f"{shown(path)}: {what} holds a JSON {type(data).__name__}, not an object; restore the file save_pretrained wrote")
    if _depth(data, MAX_NESTING) > MAX_NESTING:
        raise FolderProblem(f"{shown(path)}: {what} nests deeper than {MAX_NESTING} levels; restore the file save_pretrained wrote")
    return data


# ------------------------------------------------------------------------------ config values
def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


@dataclass(frozen=True)
class Bound:
    """What one config key may hold. kind: "int", "float" (finite), "ints", "floats" or "bools"
    (lists of them, at most `length` long); `low`/`high` bound each number (`low_open`: strictly
    above low)."""

    kind: str
    low: float = 0
    high: float = math.inf
    low_open: bool = False
    nullable: bool = False
    length: int = 64

    def describe(self) -> str:
        if self.kind == "bools":
            return f"a list of at most {self.length} true/false values"
        noun = {"int": "an integer", "float": "a finite number", "ints": "a list of integers", "floats": "a list of finite numbers"}[self.kind]
        low = f"above {_number(self.low)}" if self.low_open else f"at least {_number(self.low)}"
        span = low if self.high == math.inf else f"{low} and at most {_number(self.high)}"
        each = ", each" if self.kind in ("ints", "floats") else ""
        none = " (or null)" if self.nullable else ""
        return f"{noun}{none}{each} {span}"

    def _number_ok(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind in ("int", "ints") and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if self.kind in ("int", "float"):
            return self._number_ok(value)
        if not isinstance(value, list) or len(value) > self.length:
            return False
        if self.kind == "bools":
            return all(isinstance(v, bool) for v in value)
        return all(self._number_ok(v) for v in value)


def config_problem(config: Mapping, bounds: Mapping[str, Bound], path: Path, prefix: str = "") -> FolderProblem | None:
    """The first key of `config` that breaks its bound (keys without a bound are the library's to
    judge; an absent key takes the class default), as a FolderProblem naming the file and key."""
    for key, bound in bounds.items():
        if key in config and not bound.accepts(config[key]):
            found = json.dumps(config[key])
            found = found if len(found) <= 60 else found[:57] + "..."
            return FolderProblem(
                f"{shown(path)}: {prefix}{key} is {found}; it must be {bound.describe()}. "
                "Fix the config, or use the config save_pretrained wrote with these weights"
            )
    return None


# ------------------------------------------------------------------------------ safetensors headers
def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from a safetensors file's header, reading the header only.

    The header's length (the first 8 bytes) must be under MAX_HEADER_BYTES and inside the file,
    and every tensor's byte range must match its dtype and shape and lie inside the file: a
    header cannot claim more than the file holds."""
    path = Path(path)
    size = _regular_size(path, "weight file")
    fix = "the file is damaged or not safetensors; restore it (save_pretrained(..., safe_serialization=True))"
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise FolderProblem(f"{shown(path)}: {size} bytes, too short for a safetensors header; {fix}")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise FolderProblem(
                f"{shown(path)}: the safetensors header claims {length} bytes (the file has {size}, the cap is "
                f"{MAX_HEADER_BYTES}); {fix}"
            )
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FolderProblem(f"{shown(path)}: the safetensors header is not a JSON object; {fix}") from None
    if not isinstance(header, dict):
        raise FolderProblem(f"{shown(path)}: the safetensors header is not a JSON object; {fix}")
    data_bytes = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(entry, data_bytes)
        if problem:
            raise FolderProblem(f"{shown(path)}: tensor {name!r} {problem}; {fix}")
        tensors[name] = (entry["dtype"], tuple(entry["shape"]))
    return tensors


def _entry_problem(entry, data_bytes: int) -> str | None:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        return "is not a {dtype, shape, data_offsets} record"
    dtype, dims, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BYTES:
        return f"has unknown dtype {str(dtype)[:20]!r}"
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return f"has shape {str(dims)[:60]}, not a list of non-negative integers"
    if (
        not isinstance(offsets, list) or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):  # fmt: skip
        return f"has byte range {str(offsets)[:60]} outside the file's {data_bytes} data bytes"
    if offsets[1] - offsets[0] != math.prod(dims) * DTYPE_BYTES[dtype]:
        return f"has {offsets[1] - offsets[0]} bytes for shape {tuple(dims)} of {dtype}"
    return None


# ------------------------------------------------------------------------------ a folder's weights
def index_files(folder: Path, index: Path) -> list[Path]:
    """The weight files a `*.safetensors.index.json` names, each resolved inside `folder`."""
    data = read_config(index, "weight index")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise FolderProblem(
            f"{shown(index)}: weight_map is not an object of tensor name -> file name; restore the index save_pretrained wrote"
        )
    root = folder.resolve()
    files = []
    for name in sorted(set(weight_map.values())):
        target = (folder / name).resolve()
        if not target.is_relative_to(root) or target == root:
            raise FolderProblem(
                f"{shown(index)}: weight_map names {name!r}, which is outside the folder {shown(folder)}; an index may "
                "only name files in its own folder (no '..', absolute path or symlink out): fix the index or copy the shards in"
            )
        if not name.endswith(".safetensors"):
            raise FolderProblem(f"{shown(index)}: weight_map names {name!r}, not a .safetensors file; only safetensors weights are read")
        if not target.exists():
            raise FolderProblem(f"{shown(index)}: weight_map names {name!r}, which is not in the folder; restore the shard or the index")
        files.append(target)
    return files


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files a folder's weights are in: those its one index names, else `*.safetensors`."""
    folder = Path(folder)
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise FolderProblem(f"{shown(folder)}: several weight indexes {[p.name for p in indexes]}; keep one")
    if indexes:
        return index_files(folder, indexes[0])
    return sorted(folder.glob("*.safetensors"))


def folder_weight_shapes(folder: Path, files: list[Path] | None = None) -> tuple[dict[str, tuple[int, ...]], dict[str, Path]]:
    """({tensor name: shape}, {tensor name: its file}) over a folder's weight files, headers only; a
    name in two files is refused."""
    shapes: dict[str, tuple[int, ...]] = {}
    file_of: dict[str, Path] = {}
    for file in weight_files(folder) if files is None else files:
        for name, (_, dims) in read_safetensors_header(file).items():
            if name in file_of:
                raise FolderProblem(
                    f"{shown(folder)}: tensor {name!r} is in both {file_of[name].name} and {file.name}; remove the duplicate file"
                )
            shapes[name], file_of[name] = dims, file
    return shapes, file_of


# ------------------------------------------------------------------------------ the config against the weights
def meta_shapes(build: Callable[[], object], config_path: Path, what: str) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the state dict of the module `build()` makes on the meta device (no memory
    is allocated); a config the library cannot build from is a FolderProblem naming the file."""
    import torch

    try:
        with torch.device("meta"):
            module = build()
        return {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    except Exception as exc:  # the library's own refusal of the config's values, whatever its type
        raise FolderProblem(
            f"{shown(config_path)}: does not build a {what} ({type(exc).__name__}: {library_text(exc)}); "
            "use the config save_pretrained wrote with these weights"
        ) from None


def shape_problem(
    built: Mapping[str, tuple[int, ...]], on_disk: Mapping[str, tuple[int, ...]], config_path: Path, folder: Path
) -> FolderProblem | None:
    """Whether the weights hold every tensor the config builds, at its shape (extra tensors on disk
    are the loader's business, e.g. heads a text-to-image model does not build)."""
    missing = sorted(k for k in built if k not in on_disk)
    differ = sorted(k for k in built if k in on_disk and tuple(on_disk[k]) != tuple(built[k]))
    if not missing and not differ:
        return None
    fix = "the config is not the one these weights were saved with; use the folder's own config.json and weights"
    if differ:
        key = differ[0]
        more = f" (and {len(differ) - 1} more tensors differ)" if len(differ) > 1 else ""
        return FolderProblem(
            f"{shown(config_path)}: builds {key} as {tuple(built[key])}, but the weights in {shown(folder)} hold "
            f"{tuple(on_disk[key])}{more}; {fix}"
        )
    listed = ", ".join(missing[:SHOWN]) + (f" (and {len(missing) - SHOWN} more)" if len(missing) > SHOWN else "")
    return FolderProblem(f"{shown(config_path)}: builds {len(missing)} tensor(s) no weight file in {shown(folder)} holds: {listed}; {fix}")
