"""Preference pairs stored in webdataset-style tar shards.

A sample is the run of consecutive members sharing a key, split the webdataset way
(``dir/abc.winner.png`` -> key ``dir/abc``, extension ``winner.png``). Each sample needs:

- ``json``: ``{"id": ..., "prompt": ...}`` plus optional ``winner_prompt`` /
  ``loser_prompt``; tie markers are rejected as in the JSONL format;
- exactly one ``winner.<ext>`` and one ``loser.<ext>``, ``<ext>`` one of
  ``png``, ``jpg``, ``jpeg``, ``webp``.

Other members (``txt``, ``cls``, ...) are ignored. Shards are given as paths, a list of
paths, or a webdataset brace pattern (``shards/pairs-{000..009}.tar``). Pairs are read
by index in any order, so shards must be local, uncompressed ``.tar`` files: at
construction each shard's member table and ``json`` members are read once (no image
bytes are read or decoded); a pair's image bytes are then read at the recorded offsets.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

from webdataset.shardlists import expand_urls
from webdataset.tariterators import base_plus_ext

from cosmos_rl.data.images import ImageSize, as_height_width, decode_image
from cosmos_rl.data.pair_record import PreferencePair, PromptSides, parse_pair_metadata
from cosmos_rl.errors import UserError

IMAGE_EXTENSIONS = ("png", "jpg", "jpeg", "webp")


@dataclass(frozen=True)
class _Blob:
    offset: int
    size: int


@dataclass(frozen=True)
class _Sample:
    shard: Path
    key: str
    id: str
    prompt: str
    winner: _Blob
    loser: _Blob
    winner_prompt: Optional[str]
    loser_prompt: Optional[str]

    @property
    def origin(self) -> str:
        return f"{self.shard} sample {self.key!r}"


def _shard_paths(urls_or_paths: Union[str, Path, Sequence[Union[str, Path]]]) -> list[Path]:
    if isinstance(urls_or_paths, (str, Path)):
        urls = expand_urls(str(urls_or_paths))
    else:
        urls = [str(url) for url in urls_or_paths]
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
        path = Path(local)
        if not path.is_file():
            raise UserError(f"{path}: tar shard not found; check the shard paths or pattern")
        paths.append(path)
    return paths


def _members_by_sample(shard: Path, archive: tarfile.TarFile) -> list[tuple[str, dict[str, tarfile.TarInfo]]]:
    samples: list[tuple[str, dict[str, tarfile.TarInfo]]] = []
    seen: set[str] = set()
    for member in archive.getmembers():
        if not member.isreg():
            continue
        key, ext = base_plus_ext(member.name)
        if key is None:
            raise UserError(
                f"{shard}: member {member.name!r} has no extension; samples are named <key>.<ext>"
            )
        if not samples or samples[-1][0] != key:
            if key in seen:
                raise UserError(
                    f"{shard} sample {key!r}: its members are not consecutive (or the key repeats); "
                    "write each sample's files together with a unique key"
                )
            seen.add(key)
            samples.append((key, {}))
        members = samples[-1][1]
        if ext in members:
            raise UserError(f"{shard} sample {key!r}: member {ext!r} appears twice")
        members[ext] = member
    return samples


def _side_blob(members: dict[str, tarfile.TarInfo], side: str, origin: str) -> _Blob:
    found = [ext for ext in (f"{side}.{e}" for e in IMAGE_EXTENSIONS) if ext in members]
    if len(found) != 1:
        problem = "no" if not found else f"{len(found)} ({', '.join(found)})"
        raise UserError(
            f"{origin}: {problem} {side} image; expected exactly one of "
            f"{', '.join(f'{side}.{e}' for e in IMAGE_EXTENSIONS)} (members: {', '.join(sorted(members))})"
        )
    member = members[found[0]]
    return _Blob(member.offset_data, member.size)


def _index_shard(shard: Path) -> list[_Sample]:
    try:
        archive = tarfile.open(shard, mode="r:")
    except tarfile.TarError as exc:
        raise UserError(f"{shard}: not an uncompressed tar file ({exc}); re-pack it as a plain .tar") from exc
    with archive:
        samples = []
        for key, members in _members_by_sample(shard, archive):
            origin = f"{shard} sample {key!r}"
            if "json" not in members:
                raise UserError(
                    f"{origin}: no 'json' member (members: {', '.join(sorted(members))}); "
                    'each sample needs a json member with {"id", "prompt"}'
                )
            try:
                row = json.loads(archive.extractfile(members["json"]).read())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(f"{origin}: json member is not valid JSON ({exc})") from exc
            pair_id, prompt, winner_prompt, loser_prompt = parse_pair_metadata(row, origin)
            winner = _side_blob(members, "winner", origin)
            loser = _side_blob(members, "loser", origin)
            samples.append(_Sample(shard, key, pair_id, prompt, winner, loser, winner_prompt, loser_prompt))
    return samples


class TarShardPairs:
    """Preference pairs from webdataset tar shards; see the module docstring for the layout."""

    def __init__(self, urls_or_paths: Union[str, Path, Sequence[Union[str, Path]]], image_size: ImageSize):
        self.image_size = as_height_width(image_size)
        self.shards = _shard_paths(urls_or_paths)
        samples: list[_Sample] = []
        origin_of: dict[str, str] = {}
        for shard in self.shards:
            for sample in _index_shard(shard):
                if sample.id in origin_of:
                    raise UserError(
                        f"{sample.origin}: duplicate id {sample.id!r} (first in {origin_of[sample.id]}); "
                        "ids must be unique across shards"
                    )
                origin_of[sample.id] = sample.origin
                samples.append(sample)
        if not samples:
            raise UserError(f"{', '.join(map(str, self.shards))}: the shards hold no samples")
        self._samples = samples

    def __len__(self) -> int:
        return len(self._samples)

    def _read(self, sample: _Sample, blob: _Blob, side: str):
        origin = f"{sample.origin} (id {sample.id!r}) {side}"
        with open(sample.shard, "rb") as handle:
            handle.seek(blob.offset)
            data = handle.read(blob.size)
        if len(data) != blob.size:
            raise UserError(f"{origin}: shard is shorter than when it was indexed; was it rewritten?")
        return decode_image(data, self.image_size, origin)

    def __getitem__(self, index: int) -> PreferencePair:
        if not 0 <= index < len(self._samples):
            raise IndexError(f"pair index {index} out of range [0, {len(self._samples)})")
        sample = self._samples[index]
        return PreferencePair(
            id=sample.id,
            prompt=sample.prompt,
            winner=self._read(sample, sample.winner, "winner"),
            loser=self._read(sample, sample.loser, "loser"),
        )

    def membership_ids(self) -> list[str]:
        return [sample.id for sample in self._samples]

    def prompt_sides(self) -> list[PromptSides]:
        return [
            PromptSides(s.id, s.origin, s.prompt, s.winner_prompt, s.loser_prompt) for s in self._samples
        ]
