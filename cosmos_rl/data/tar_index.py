"""Indexing webdataset-style tar shards of preference pairs, without opening any image or clip; torch-free.

The one reader of the layout (see :mod:`cosmos_rl.data.tar_pairs`): it expands the shard list,
reads each shard's member table and ``json`` members, and records where each side's image bytes
lie, with the SHA-256 the sample's json records for it (:mod:`cosmos_rl.data.member_checksums`),
verified when the bytes are read (:func:`read_blob`). The run's source stops at the first problem it returns, ``validate`` lists all of them.
A shard that ends early (cut during a copy) is a problem of that shard: ``tarfile`` itself stops
silently at a cut that falls on a member header, so the end-of-archive block is checked too.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from braceexpand import braceexpand

from cosmos_rl.core.files import MAX_CLIP_BYTES, MAX_METADATA_BYTES, check_name
from cosmos_rl.data.image_files import MAX_IMAGE_BYTES
from cosmos_rl.data.member_checksums import recorded, verify
from cosmos_rl.data.pair_metadata import parse_pair_metadata
from cosmos_rl.core.errors import UserError

IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "webp")
CLIP_EXTENSIONS = ("mp4",)  # clip members: of a video run's caption samples and pair sides
_BLOCK = 512  # tar's record unit: headers and data are padded to it


@dataclass(frozen=True)
class Blob:
    offset: int
    size: int
    member: str = ""  # its extension within the sample ("winner.mp4"), named when its checksum fails
    sha256: Optional[str] = None  # what the sample's json records for it; None: read unverified


@dataclass(frozen=True)
class TarSample:
    shard: Path
    key: str
    id: str
    prompt: str
    winner: Blob
    loser: Blob
    winner_prompt: Optional[str]
    loser_prompt: Optional[str]

    @property
    def origin(self) -> str:
        return f"{self.shard} sample {self.key!r}"


def split_member_name(name: str) -> Optional[tuple[str, str]]:
    """``dir/abc.winner.png`` -> ``("dir/abc", "winner.png")``: the key ends at the file name's first dot."""
    folder, slash, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not stem or not dot:
        return None
    return folder + slash + stem, ext


# A shard list names at most this many shards: a million shards of the 1000 pairs `pairs mine`
# writes per shard is a billion pairs, and the list of names alone is ~100 MB. braceexpand builds
# every range in full (itertools.product), so `{0..99999999999999}` took 3 GB in 15 s before failing.
SHARD_NAMES_MAX = 1_000_000


def shard_names(entries: Sequence[Union[str, Path]]) -> list[str]:
    """Every shard name a shard list gives, in order: each entry's ``::``-joined parts, each part
    brace-expanded (``pairs-{000..002}.tar`` is three). The one expansion the reader, preflight and
    plan share. Counted before it is expanded: more than SHARD_NAMES_MAX names is a UserError."""
    parts = [part for entry in entries for part in str(entry).split("::")]
    total = 0
    for part in parts:
        total += brace_count(part, SHARD_NAMES_MAX - total)
    return [name for part in parts for name in braceexpand(part)]


class _TooMany(Exception):
    pass


def brace_count(pattern: str, limit: int = SHARD_NAMES_MAX) -> int:
    """How many names braceexpand(pattern) gives, worked out without expanding (the same grammar,
    counting instead of generating); a UserError when it, or any range inside it, exceeds `limit`."""
    try:
        return _pattern_count(pattern, max(limit, 0))
    except _TooMany:
        raise UserError(
            f"{pattern[:200]!r}: names more than {SHARD_NAMES_MAX} shards in all, the cap (a million shards of the 1000 "
            "pairs `pairs mine` writes per shard is a billion pairs, so a larger brace range is a typo); check the range"
        ) from None
    except ValueError:  # an unbalanced brace: braceexpand raises its own error, reported where it is read
        return 0


def _bounded(n: int, limit: int) -> int:
    if n > limit:
        raise _TooMany
    return n


def _pattern_count(pattern: str, limit: int) -> int:
    # braceexpand.parse_pattern: the product of its top-level items.
    start = pos = depth = 0
    total = 1
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0:
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                total = _bounded(total * _expression_count(pattern[start + 1:pos], limit), limit)
        pos += 1
    if depth != 0:
        raise ValueError("unbalanced braces")
    return total


_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")


def _expression_count(expr: str, limit: int) -> int:
    # braceexpand.parse_expression: an int range, a char range, a comma list, else literal braces.
    if len(expr) > 10_000:  # a range of numbers that long is past any limit (and int() refuses 4300+ digits)
        raise _TooMany
    match = _INT_RANGE.match(expr)
    if match:
        if max(len(match.group(1)), len(match.group(2))) > 4000:  # int() refuses 4300+ digits; no shard is numbered so
            raise _TooMany
        first, last, step = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0) or 1
        return _bounded(abs(last - first) // step + 1, limit)
    match = _CHAR_RANGE.match(expr)
    if match:
        return len(list(braceexpand("{" + expr + "}")))  # at most 52 letters
    depth, start, items = 0, 0, []
    pos = 0
    while pos < len(expr):
        char = expr[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not items:
        return _pattern_count(expr, limit)  # braces kept literally around the expanded inside
    items.append(expr[start:])
    return _bounded(sum(_pattern_count(item, limit) for item in items), limit)


def shard_paths(urls_or_paths: Union[str, Path, Sequence[Union[str, Path]]]) -> list[Path]:
    """Local shard paths from a path or a list of them; each may be a brace pattern
    (``pairs-{000..009}.tar``), and ``::`` joins patterns in one string."""
    entries = [urls_or_paths] if isinstance(urls_or_paths, (str, Path)) else list(urls_or_paths)
    urls = shard_names(entries)
    if not urls:
        raise UserError("no tar shards given; pass shard paths or a brace pattern")
    paths = []
    for url in urls:
        local = url[len("file:"):] if url.startswith("file:") else url
        if "://" in local or local.startswith("pipe:"):
            raise UserError(
                f"{url}: pairs are read by index, which needs a local shard; copy the shards "
                "to local disk and pass their paths"
            )
        path = check_name(local, "", "tar shard")  # is_file would call a NUL-holding name missing
        if not path.is_file():
            raise UserError(f"{path}: tar shard not found; check the shard paths or pattern")
        paths.append(path)
    return paths


def _members_by_sample(shard: Path, members: list[tarfile.TarInfo]) -> list[tuple[str, dict[str, tarfile.TarInfo]]]:
    samples: list[tuple[str, dict[str, tarfile.TarInfo]]] = []
    seen: set[str] = set()
    for member in members:
        if not member.isreg():
            continue
        split = split_member_name(member.name)
        if split is None:
            raise UserError(f"{shard}: member {member.name!r} has no extension; samples are named <key>.<ext>")
        key, ext = split
        if not samples or samples[-1][0] != key:
            if key in seen:
                raise UserError(
                    f"{shard} sample {key!r}: its members are not consecutive (or the key repeats); "
                    "write each sample's files together with a unique key"
                )
            seen.add(key)
            samples.append((key, {}))
        found = samples[-1][1]
        if ext in found:
            raise UserError(f"{shard} sample {key!r}: member {ext!r} appears twice")
        found[ext] = member
    return samples


def side_blob(
    members: dict[str, tarfile.TarInfo], side: str, origin: str, extensions: Sequence[str] = IMAGE_EXTENSIONS, what: str = "image",
    checksums: Mapping[str, str] = {},
) -> Blob:
    """The one ``<side>.<ext>`` member's bytes (``side`` "" for a plain ``<ext>``), ``ext`` one of
    ``extensions`` (a ``what``: "image", or "clip" with CLIP_EXTENSIONS), with the digest
    ``checksums`` (the json's ``sha256``, member extension -> hex) records for it, if any."""
    found = [ext for ext in (f"{side}.{e}" if side else e for e in extensions) if ext in members]
    if len(found) != 1:
        problem = "no" if not found else f"{len(found)} ({', '.join(found)})"
        raise UserError(
            f"{origin}: {problem} {side or 'sample'} {what}; expected exactly one of "
            f"{', '.join(f'{side}.{e}' if side else e for e in extensions)} (members: {', '.join(sorted(members))})"
        )
    member = members[found[0]]
    # The member is read whole later (read_blob); its declared size is the header's word, and a
    # sparse or hostile member may declare GiBs. No image or clip a run trains on is that large.
    limit = MAX_CLIP_BYTES if what == "clip" else MAX_IMAGE_BYTES
    if member.size > limit:
        raise UserError(f"{origin}: member {member.name!r} declares {member.size} bytes, over the {limit}-byte limit for "
                        f"a{'n' if what == 'image' else ''} {what}; it is damaged or not one: re-pack the shard")
    return Blob(member.offset_data, member.size, found[0], checksums.get(found[0]))


def metadata_member(archive: tarfile.TarFile, member: tarfile.TarInfo, origin: str) -> bytes:
    """A sample's ``json`` or ``txt`` member, read whole after its declared size is checked against
    MAX_METADATA_BYTES (a sparse member declaring GiBs would otherwise be read as zeros into memory)."""
    if member.size > MAX_METADATA_BYTES:
        raise UserError(f"{origin}: member {member.name!r} declares {member.size} bytes, over the {MAX_METADATA_BYTES}-byte "
                        "limit for a sample's metadata; it is damaged or not metadata: re-pack the shard")
    handle = archive.extractfile(member)
    data = handle.read(MAX_METADATA_BYTES + 1) if handle is not None else b""
    if len(data) != member.size:
        raise UserError(f"{origin}: member {member.name!r} holds {len(data)} of its {member.size} bytes; copy the shard again")
    return data


def _check_complete(shard: Path, handle, members: list[tarfile.TarInfo]) -> None:
    """Fail unless the shard ends with the end-of-archive (zero) block after its last member."""
    size = os.fstat(handle.fileno()).st_size
    end = 0
    if members:
        last = members[-1]
        end = last.offset_data + -(-last.size // _BLOCK) * _BLOCK
        if last.offset_data + last.size > size:
            raise UserError(
                f"{shard}: truncated: member {last.name!r} needs {last.offset_data + last.size} bytes but the "
                f"shard has {size}; copy it again or re-pack it"
            )
    handle.seek(end)
    if handle.read(_BLOCK) != bytes(_BLOCK):
        after = repr(members[-1].name) if members else "the start"
        raise UserError(
            f"{shard}: truncated: no end-of-archive block after {after} ({size} bytes); copy it again or re-pack it"
        )


def _side_of(members: dict[str, tarfile.TarInfo], side: str, origin: str, frames: int, checksums: Mapping[str, str]) -> Blob:
    """One side's media member: an image at ``frames`` = 1, an mp4 clip of a video run (``frames`` > 1).
    The wrong kind is named as such, so a shard written for the other kind of run says so."""
    images = [f"{side}.{e}" for e in IMAGE_EXTENSIONS if f"{side}.{e}" in members]
    clips = [f"{side}.{e}" for e in CLIP_EXTENSIONS if f"{side}.{e}" in members]
    if frames > 1:
        if images and not clips:
            raise UserError(
                f"{origin}: {side} is an image ({images[0]}), but clips of {frames} frames are expected "
                f"(model.num_frames); give every sample {side}.mp4 (or set model.num_frames = 1)"
            )
        return side_blob(members, side, origin, CLIP_EXTENSIONS, "clip", checksums)
    if clips and not images:
        raise UserError(
            f"{origin}: {side} is a clip ({clips[0]}), but this run trains images (model.num_frames = 1); "
            f"give every sample a {side} image, or set model.num_frames to the clips' frame count"
        )
    return side_blob(members, side, origin, checksums=checksums)


def _sample_of(
    archive: tarfile.TarFile, key: str, members: dict[str, tarfile.TarInfo], shard: Path, frames: int
) -> TarSample:
    origin = f"{shard} sample {key!r}"
    if "json" not in members:
        raise UserError(
            f"{origin}: no 'json' member (members: {', '.join(sorted(members))}); "
            'each sample needs a json member with {"id", "prompt"}'
        )
    try:
        row = json.loads(metadata_member(archive, members["json"], origin))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise UserError(f"{origin}: json member is not valid JSON ({exc})") from exc
    pair_id, prompt, winner_prompt, loser_prompt = parse_pair_metadata(row, origin)
    checksums = recorded(row, members, origin)
    winner = _side_of(members, "winner", origin, frames, checksums)
    loser = _side_of(members, "loser", origin, frames, checksums)
    return TarSample(shard, key, pair_id, prompt, winner, loser, winner_prompt, loser_prompt)


def index_shard(shard: Path, frames: int) -> tuple[list[TarSample], list[UserError]]:
    """The shard's good samples and every sample's problem; damage to the shard itself is one problem.
    ``frames`` is the run's frame count (``MediaSpec.frames``): above 1 each side is an mp4 clip
    (``winner.mp4``). The count alone: ``validate`` indexes shards even when the frame size is incomplete."""
    return index_members(shard, partial(_sample_of, frames=frames))


def index_members(shard: Path, sample_of) -> tuple[list, list[UserError]]:
    """Any webdataset layout: ``sample_of(archive, key, members, shard)`` turns one sample's
    members (extension -> TarInfo) into a record or raises a UserError naming the sample."""
    try:
        archive = tarfile.open(shard, mode="r:")
    except tarfile.TarError as exc:
        return [], [UserError(f"{shard}: not an uncompressed tar file ({exc}); re-pack it as a plain .tar")]
    samples: list = []
    problems: list[UserError] = []
    with archive:
        try:
            members = archive.getmembers()
            _check_complete(shard, archive.fileobj, members)
            grouped = _members_by_sample(shard, members)
        except (tarfile.TarError, EOFError) as exc:
            return [], [UserError(f"{shard}: truncated or damaged tar ({type(exc).__name__}: {exc}); copy it again or re-pack it")]
        except UserError as exc:
            return [], [exc]
        for key, found in grouped:
            try:
                samples.append(sample_of(archive, key, found, shard))
            except UserError as exc:
                problems.append(exc)
            except (tarfile.TarError, EOFError) as exc:
                problems.append(UserError(f"{shard} sample {key!r}: cannot read the json member ({exc}); copy the shard again"))
    return samples, problems


def index_shards(shards: Sequence[Path], frames: int) -> tuple[list[TarSample], list[UserError]]:
    """Every shard's samples in order, ids unique across shards, and every problem found (``frames``:
    as :func:`index_shard`)."""
    samples: list[TarSample] = []
    problems: list[UserError] = []
    origin_of: dict[str, str] = {}
    for shard in shards:
        found, bad = index_shard(shard, frames)
        problems += bad
        for sample in found:
            if sample.id in origin_of:
                problems.append(UserError(
                    f"{sample.origin}: duplicate id {sample.id!r} (first in {origin_of[sample.id]}); "
                    "ids must be unique across shards"
                ))
                continue
            origin_of[sample.id] = sample.origin
            samples.append(sample)
    if not samples and not problems:
        problems.append(UserError(f"{', '.join(map(str, shards))}: the shards hold no samples"))
    return samples, problems


def read_blob(sample: TarSample, blob: Blob, origin: str) -> bytes:
    """The blob's bytes, verified against the SHA-256 the sample's json records for it (if any)."""
    with open(sample.shard, "rb") as handle:
        handle.seek(blob.offset)
        data = handle.read(blob.size)
    if len(data) != blob.size:
        raise UserError(f"{origin}: shard is shorter than when it was indexed; was it rewritten?")
    verify(data, blob.sha256, blob.member, origin)
    return data
