"""`validate`'s read of the data a manifest names: cheap, torch-free, every problem at once.

Rows go through the run's own readers (:mod:`~cosmos_rl.data.jsonl_rows`,
:mod:`~cosmos_rl.data.tar_index`, :mod:`~cosmos_rl.data.prompt_file`), so a row `validate` passes
is a row the run accepts: every JSONL row parses and names existing image files, ids are unique,
every tar shard is complete and indexes, every prompt row parses. That pass reads metadata only and
is what the run itself does when it starts.

Opening images costs a file read each, so by default only a sample of rows has its images opened
and verified (header decoded; PNG chunk checksums checked; pixels not decoded): the first
:data:`SAMPLE_HEAD` rows plus :data:`SAMPLE_DRAWN` more drawn from the rest with
``random.Random(SAMPLE_SEED)`` - the same rows on every call. ``full=True`` (``validate --data
all``) opens every image. At most :data:`MAX_LISTED` problems are listed per source, then a count.

Clips (mp4 members or ``"video"`` rows of an image-caption source; both sides of a video run's
preference pairs) are sampled the same way and checked by
:func:`~cosmos_rl.data.clip_files.check_clip` against the run's frames and size: the container, one
video stream, the declared size and frame count (a decoding bomb is refused before any decoding),
then every frame decoded: only decoding finds a damaged stream. A shard member whose json records
its SHA-256 (the clips the project writes) is hashed first, by the run's own
:func:`~cosmos_rl.data.tar_index.read_blob`: damage FFmpeg decodes silently is found there.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Optional, Sequence

from cosmos_rl.core import schema
from cosmos_rl.core.paths import resolve_path
from cosmos_rl.core.problems import Problem
from cosmos_rl.data.caption_index import index_caption_shards, read_caption_rows
from cosmos_rl.core.files import MAX_CLIP_BYTES, open_user_file
from cosmos_rl.data.image_files import MAX_IMAGE_BYTES, check_image
from cosmos_rl.data.jsonl_rows import PairRow, read_pair_rows
from cosmos_rl.data import first_frame_files
from cosmos_rl.data.prompt_file import read_prompt_rows
from cosmos_rl.data.tar_index import TarSample, index_shards, read_blob, shard_paths
from cosmos_rl.core.errors import UserError

SAMPLE_HEAD = 32
SAMPLE_DRAWN = 96
SAMPLE_SEED = 0
MAX_LISTED = 100
# What a layer above adds to the prompt file's check: (file, rows) -> one message per row it cannot use.
RowProblems = Callable[[Path, Sequence], list[str]]


def sample_rows(count: int, full: bool) -> list[int]:
    """Row indices whose images are opened: all, or the first SAMPLE_HEAD plus SAMPLE_DRAWN drawn."""
    if full or count <= SAMPLE_HEAD + SAMPLE_DRAWN:
        return list(range(count))
    drawn = random.Random(SAMPLE_SEED).sample(range(SAMPLE_HEAD, count), SAMPLE_DRAWN)
    return list(range(SAMPLE_HEAD)) + sorted(drawn)


_SINGULAR = {"images": "image", "clips": "clip", "images and clips": "image and clip"}


def _sample_note(count: int, chosen: int, full: bool, what: str = "images") -> str:
    if chosen == count:
        return f"{what} of all {count} rows opened"
    return (f"{what} of {chosen} of {count} rows opened (the first {SAMPLE_HEAD} and {SAMPLE_DRAWN} drawn with seed "
            f"{SAMPLE_SEED}; --data all opens every {_SINGULAR[what]})")


def _image_file(path: Path, origin: str) -> None:
    with open_user_file(path, origin, "image file", MAX_IMAGE_BYTES) as handle:
        try:
            check_image(handle, origin)
        except OSError as exc:
            raise UserError(f"{origin}: cannot read image file ({exc.strerror}); check the path") from exc


def _check_clip(data, frames: int, height: int, width: int, origin: str) -> None:
    """`data.clip_files.check_clip`, imported on first use: it imports PyAV, which `validate` of an
    image run never needs."""
    from cosmos_rl.data.clip_files import check_clip as check

    check(data, frames, height, width, origin)


def _clip_file(path: Path, media: tuple[int, int, int], origin: str) -> None:
    with open_user_file(path, origin, "clip file", MAX_CLIP_BYTES) as handle:
        try:
            _check_clip(handle, *media, origin)
        except OSError as exc:
            raise UserError(f"{origin}: cannot read clip file ({exc.strerror}); check the path") from exc


def _jsonl_sides(jsonl: Path, row: PairRow, media: tuple[int, int, int]) -> None:
    """Both sides of a pair row: images, or clips of a video run (`media` = (frames, height, width))."""
    origin = f"{jsonl}:{row.line} (id {row.id!r})"  # as the run's JsonlPairs words it
    for side, path in (("winner", row.winner), ("loser", row.loser)):
        if media[0] > 1:
            if min(media) >= 1:  # else the model's size is incomplete: preflight reports it
                _clip_file(path, media, f"{origin} {side}: {path}")
        else:
            _image_file(path, f"{origin} {side}: {path}")


def _tar_sides(sample: TarSample, media: tuple[int, int, int]) -> None:
    for side, blob in (("winner", sample.winner), ("loser", sample.loser)):
        origin = f"{sample.origin} (id {sample.id!r}) {side}"  # as the run's TarShardPairs words it
        data = read_blob(sample, blob, origin)
        if media[0] > 1:
            if min(media) >= 1:  # else the model's size is incomplete: preflight reports it
                _check_clip(data, *media, origin)
        else:
            check_image(data, origin)


class _Source:
    """Problems and notes of one manifest key, capped at MAX_LISTED listed problems."""

    def __init__(self, key: str):
        self.key = key
        self.problems: list[Problem] = []
        self.unlisted = 0

    def add(self, exc: UserError) -> None:
        if len(self.problems) < MAX_LISTED:
            self.problems.append(Problem(self.key, str(exc)))
        else:
            self.unlisted += 1

    def finish(self) -> list[Problem]:
        if self.unlisted:
            self.problems.append(Problem(self.key, f"{self.unlisted} more problem(s) not listed (the first {MAX_LISTED} are)"))
        return self.problems


def _open_images(source: _Source, items: Sequence, check: Callable, full: bool, what: str = "images") -> str:
    chosen = sample_rows(len(items), full)
    for index in chosen:
        try:
            check(items[index])
        except UserError as exc:
            source.add(exc)
    return _sample_note(len(items), len(chosen), full, what)


def _media_noun(items: Sequence) -> str:
    kinds = {item.kind for item in items}
    return "clips" if kinds == {"clip"} else "images and clips" if "clip" in kinds else "images"


def _pairs(
    key: str, data: schema.PreferenceDataConfig, base: Path, full: bool, media: tuple[int, int, int]
) -> tuple[list[Problem], list[str]]:
    """One preference source, read as `data.pairs` reads it; a video run's (`media[0]` > 1) sides are
    clips checked against `media` = (frames, height, width)."""
    if data.synthetic_pairs:
        return [], []
    frames = media[0]
    what = "clips" if frames > 1 else "images"
    if data.jsonl:
        source, path = _Source(f"{key}.jsonl"), Path(resolve_path(data.jsonl, base))
        if not path.is_file():
            return [], []  # preflight reports it
        try:
            rows, bad = read_pair_rows(path, frames)
        except UserError as exc:
            source.add(exc)
            return source.finish(), []
        for exc in bad:
            source.add(exc)
        note = _open_images(source, rows, lambda row: _jsonl_sides(path, row, media), full, what)
        return source.finish(), [f"{source.key}: {len(rows)} good rows, {len(bad)} bad; {note}"]
    if data.shards:
        source = _Source(f"{key}.shards")
        try:
            shards = shard_paths([resolve_path(entry, base) for entry in data.shards])
        except UserError as exc:
            source.add(exc)
            return source.finish(), []
        samples, bad = index_shards(shards, frames)
        for exc in bad:
            source.add(exc)
        note = _open_images(source, samples, lambda sample: _tar_sides(sample, media), full, what)
        return source.finish(), [f"{source.key}: {len(shards)} shard(s), {len(samples)} good samples, {len(bad)} problem(s); {note}"]
    if data.factory:
        return [], [f"{key}.factory: a custom source; validate imports it but reads no data"]
    return [], []


def _prompts(
    config: schema.RunConfig, base: Path, full: bool, row_problems: Optional[RowProblems]
) -> tuple[list[Problem], list[str]]:
    rl = config.rl
    if not rl.prompts.file:
        return [], []
    source, path = _Source("rl.prompts.file"), Path(resolve_path(rl.prompts.file, base))
    if not path.is_file():
        return [], []  # preflight reports it
    try:
        rows, bad = read_prompt_rows(path)
    except UserError as exc:
        source.add(exc)
        return source.finish(), []
    for exc in bad:
        source.add(exc)
    for message in row_problems(path, rows) if row_problems is not None else ():
        source.add(UserError(message))
    note = f"{source.key}: {len(rows)} prompts, {len(bad)} bad rows"
    if config.model.condition.source == "image":  # every row's given frame (an online run's [model.condition])
        _, height, width = run_media(config)
        for row in rows:
            if row.image is None:
                source.add(first_frame_files.missing(path, row.line))
        named = [row for row in rows if row.image is not None]
        if min(height, width) >= 1:  # else the model's size is incomplete: preflight reports it
            check = lambda row: first_frame_files.check_first_frame(row.image, f"{path}:{row.line}", height, width)  # noqa: E731
            note += "; conditioning " + _open_images(source, named, check, full)
    return source.finish(), [note]


def check_captions(
    data: schema.CaptionDataConfig, base: Path, full: bool, media: tuple[int, int, int]
) -> tuple[list[Problem], list[str]]:
    """SFT's image-caption (or clip-caption) source, read as `data.captions` reads it; clips are
    checked against ``media`` = (frames, height, width)."""
    frames = media[0]
    judge_clips = min(media) >= 1  # else the model's size is incomplete: preflight reports it
    if data.jsonl:
        source, path = _Source("rl.data.jsonl"), Path(resolve_path(data.jsonl, base))
        if not path.is_file():
            return [], []  # preflight reports it
        try:
            rows, bad = read_caption_rows(path, frames)
        except UserError as exc:
            source.add(exc)
            return source.finish(), []
        for exc in bad:
            source.add(exc)

        def check(row) -> None:
            origin = f"{path}:{row.line} (id {row.id!r}): {row.image}"  # as the run's CaptionJsonl words it
            if row.kind == "clip":
                if judge_clips:
                    _clip_file(row.image, media, origin)
            else:
                _image_file(row.image, origin)

        note = _open_images(source, rows, check, full, _media_noun(rows))
        return source.finish(), [f"{source.key}: {len(rows)} good rows, {len(bad)} bad; {note}"]
    source = _Source("rl.data.shards")
    try:
        shards = shard_paths([resolve_path(entry, base) for entry in data.shards])
    except UserError as exc:
        source.add(exc)
        return source.finish(), []
    entries, bad = index_caption_shards(shards, frames)
    for exc in bad:
        source.add(exc)

    def check_entry(entry) -> None:
        blob = read_blob(entry, entry.image, entry.origin)
        if entry.kind == "clip":
            if judge_clips:
                _check_clip(blob, *media, entry.origin)
        else:
            check_image(blob, entry.origin)

    note = _open_images(source, entries, check_entry, full, _media_noun(entries))
    return source.finish(), [f"{source.key}: {len(shards)} shard(s), {len(entries)} good samples, {len(bad)} problem(s); {note}"]


def run_media(config: schema.RunConfig) -> tuple[int, int, int]:
    """(frames, height, width) of what the run trains on, as `core.media.MediaSpec.from_model_config`
    reads the manifest, except that a size the manifest leaves incomplete is 0 (preflight reports it;
    validate still reads the rows): not a MediaSpec, which refuses it."""
    model = config.model
    frames = int(model.num_frames)
    height = model.height if model.height is not None else model.image_size
    width = model.width if model.width is not None else model.image_size
    return frames, int(height or 0), int(width or 0)


def prompt_data(
    config: schema.RunConfig, base: Path, full: bool, row_problems: Optional[RowProblems] = None
) -> tuple[list[Problem], list[str]]:
    """An online run's prompt file (NFT), with an image-to-video run's conditioning frames.
    `row_problems(path, rows)`, where given, names further rows a layer above cannot use (one
    message each), from the same read of the file."""
    return _prompts(config, base, full, row_problems)


def caption_data(config: schema.RunConfig, base: Path, full: bool) -> tuple[list[Problem], list[str]]:
    """SFT's image-caption source."""
    rl = config.rl
    return check_captions(rl.data, base, full, run_media(config)) if (rl.data.jsonl or rl.data.shards) else ([], [])


def pair_data(config: schema.RunConfig, base: Path, full: bool) -> tuple[list[Problem], list[str]]:
    """DPO's training pairs and, when validating, its held-out pairs."""
    rl, media = config.rl, run_media(config)
    problems, notes = _pairs("rl.data", rl.data, base, full, media)
    if rl.validation.every > 0:
        more, more_notes = _pairs("rl.validation.data", rl.validation.data, base, full, media)
        problems, notes = problems + more, notes + more_notes
    return problems, notes
