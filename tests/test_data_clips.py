"""Clips (mp4) as data: the lossless round trip, byte-identical encodes, every hostile clip refused with
its file and row before it can cost memory, clip-caption shards and JSONL rows, and `validate --data`."""

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from _clip_helpers import (
    flip_member_byte,
    silent_flip,
    squares_clip,
    squares_mp4,
    two_video_streams,
    with_damaged_samples,
    with_rotation,
    with_declared_frames,
    with_sample_entry_size,
    with_sps_size,
)
from _image_helpers import png_bytes
from _inproc import cosmos

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data import scan
from cosmos_rl.data.captions import CaptionJsonl, CaptionShards, caption_source
from cosmos_rl.data.clip_files import MAX_CLIP_FRAMES, MAX_CLIP_PIXELS, check_clip, encode_clip, read_clip
from cosmos_rl.data.clip_shards import ClipRecord, write_clip_shards
from cosmos_rl.data.clips import decode_clip, load_clip
from cosmos_rl.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
SFT = str(ROOT / "manifests" / "sft_shapes_cpu.toml")


# ------------------------------------------------------------------------------- encode / decode
def test_the_round_trip_is_lossless_at_even_and_odd_sizes():
    """libx264rgb at qp 0 codes RGB without chroma subsampling or a colour transform, so every pixel
    comes back: max and mean absolute error 0 (yuv420p at qp 0 is off by up to 114 levels at the
    squares' edges on this clip, yuv444p by 1: neither is used)."""
    for frames, height, width in [(9, 32, 32), (5, 31, 33)]:
        clip = squares_clip(frames, height, width)
        back = read_clip(encode_clip(clip, fps=24.0), frames, height, width, "clip")
        assert back.dtype == np.uint8 and back.shape == (frames, height, width, 3)
        assert np.array_equal(back, clip)


def test_decode_clip_is_channels_then_time_in_unit_floats(tmp_path):
    clip = squares_clip()
    tensor = decode_clip(encode_clip(clip, 24.0), 9, 32, 32, "clip")
    assert tensor.shape == (3, 9, 32, 32) and tensor.dtype == torch.float32
    # frame 3, row 5, column 8 is inside the red square (columns 8..15 at t = 3): (1, 0, 0)
    assert tensor[:, 3, 5, 8].tolist() == [1.0, 0.0, 0.0]
    assert torch.equal(tensor, torch.from_numpy(clip).permute(3, 0, 1, 2).float() / 255)
    (tmp_path / "a.mp4").write_bytes(encode_clip(clip, 24.0))
    assert torch.equal(load_clip(tmp_path / "a.mp4", 9, 32, 32), tensor)
    with pytest.raises(UserError, match=r"rows\.jsonl:2: clip file not found: .*nope\.mp4; check the path"):
        load_clip(tmp_path / "nope.mp4", 9, 32, 32, "rows.jsonl:2")


def test_encoding_is_deterministic_and_the_frame_rate_is_kept():
    clip = squares_clip()
    first = encode_clip(clip, 24.0)
    assert encode_clip(clip, 24.0) == first
    assert encode_clip(clip, 16.0) == encode_clip(clip, 16.0)
    assert b"Lavf" not in first  # bitexact: no muxer version in the container
    assert b"threads=1 " in first  # x264's own record of its settings: one thread, so one slicing
    with av.open(io.BytesIO(encode_clip(clip, 16.0))) as container:
        assert container.streams.video[0].average_rate == 16


def test_encode_refuses_what_is_not_uint8_frames():
    with pytest.raises(ValueError, match="uint8"):
        encode_clip(np.zeros((9, 32, 32, 3), dtype=np.float32), 24.0)
    with pytest.raises(ValueError, match="fps"):
        encode_clip(squares_clip(), 0.0)


# ------------------------------------------------------------------------------------ hostile clips
GOOD = squares_mp4()
HOSTILE = {
    "claims a million frames": (with_declared_frames(GOOD, 1_000_000), r"too long to decode safely \(declares 1000000 frames, the limit is 10000\)"),
    "declares 8000x8000": (with_sps_size(GOOD, 8000, 8000), r"too large to decode safely \(declares 8000x8000 = 64000000 pixels"),
    "claims 100k x 100k": (with_sample_entry_size(with_sps_size(GOOD, 100_000, 100_000), 65535, 65535), r"declares no frame size"),
    "corrupt stream": (with_damaged_samples(GOOD), r"cannot decode clip: damaged video stream after 0 good frame"),
    "too few frames": (squares_mp4(5), r"too few frames: the clip declares 5, expected exactly 9"),
    "too many frames": (squares_mp4(13), r"too many frames: the clip declares 13, expected exactly 9"),
    "more frames than declared": (with_declared_frames(squares_mp4(10), 9), r"too many frames: the clip holds at least 10"),
    "wrong size": (squares_mp4(9, 32, 48), r"wrong clip size: 48x32 \(width x height\), expected 32x32"),
    "size in the SPS only": (with_sps_size(GOOD, 64, 48), r"wrong clip size: 64x48"),
    "two video streams": (two_video_streams(), r"2 video streams, expected exactly one"),
    "tagged rotated": (with_rotation(GOOD), r"tagged to display rotated by -90 degrees; re-encode it upright"),
    "cut short": (GOOD[: len(GOOD) // 2], r"cannot open clip: not a readable mp4/mov container"),
    "not a clip": (png_bytes(), r"cannot open clip"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_hostile_clip_is_refused_naming_its_origin(name):
    data, message = HOSTILE[name]
    for call in (check_clip, read_clip):
        with pytest.raises(UserError, match=r"^rows\.jsonl:3 \(id 'c'\): .*" + message):
            call(data, 9, 32, 32, "rows.jsonl:3 (id 'c')")


def test_header_lies_that_ffmpeg_corrects_are_harmless():
    """The sample entry's own size fields are overruled by the stream's parameter set, and a header
    that declares no frame count is counted by decoding (stopping one past the expected count)."""
    assert np.array_equal(read_clip(with_sample_entry_size(GOOD, 65535, 65535), 9, 32, 32, "c"), squares_clip())
    assert np.array_equal(read_clip(with_declared_frames(GOOD, 0), 9, 32, 32, "c"), squares_clip())


def test_a_declared_huge_picture_costs_no_memory():
    """8000 x 8000 declared: refused before our decoding, and FFmpeg's own probing decode at open is
    capped at MAX_CLIP_PIXELS too. One such frame is 8000^2 x 3 B = 192 MB; without the cap, opening
    this file alone grows the process by 267 MB (measured), with it by about 21 MB (the decoder's tables)."""
    assert 8000 * 8000 > MAX_CLIP_PIXELS and MAX_CLIP_FRAMES == 10_000
    # VmHWM: this process's peak resident memory (ru_maxrss would start from the parent's peak).
    code = (
        "import re, sys\nsys.path.insert(0, 'tests')\nfrom _clip_helpers import squares_mp4, with_sps_size\n"
        "from cosmos_rl.data.clip_files import check_clip\nfrom cosmos_rl.core.errors import UserError\n"
        "peak = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "bomb = with_sps_size(squares_mp4(), 8000, 8000)\n"
        "before = peak()\n"
        "try:\n    check_clip(bomb, 9, 32, 32, 'c')\nexcept UserError as exc:\n    print('REFUSED', exc)\n"
        "print('GROWTH_KB', peak() - before)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "REFUSED c: cannot decode clip: too large to decode safely" in result.stdout, result.stdout + result.stderr
    growth_kb = int(result.stdout.split("GROWTH_KB")[1])
    assert growth_kb < 100_000, growth_kb


# ---------------------------------------------------------------------------- shards and JSONL rows
def _records(count: int, frames: int = 9) -> list[ClipRecord]:
    return [ClipRecord(np.roll(squares_clip(frames), i, axis=2), f"clip number {i}", {"task": "motion", "seed": i}) for i in range(count)]


def test_clip_shards_round_trip_and_are_byte_identical(tmp_path):
    paths = write_clip_shards(tmp_path / "a", _records(3), fps=24.0, per_shard=2)
    again = write_clip_shards(tmp_path / "b", _records(3), fps=24.0, per_shard=2)
    assert [p.name for p in paths] == ["clips-000000.tar", "clips-000001.tar"]
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    with tarfile.open(paths[0]) as tar:
        assert tar.getnames() == [f"0000000{i}.{ext}" for i in (0, 1) for ext in ("mp4", "txt", "json")]
        clip = tar.extractfile("00000001.mp4").read()
        assert json.loads(tar.extractfile("00000001.json").read()) == {
            "caption": "clip number 1", "seed": 1, "task": "motion", "sha256": {"mp4": hashlib.sha256(clip).hexdigest()}}
    source = CaptionShards([str(p) for p in paths], MediaSpec(9, 32, 32))
    assert len(source) == 3
    sample = source[2]
    assert sample.caption == "clip number 2" and sample.id == "clips-000001.tar/00000002"
    assert torch.equal(sample.image, torch.from_numpy(np.roll(squares_clip(), 2, axis=2)).permute(3, 0, 1, 2).float() / 255)
    with pytest.raises(UserError, match="already exist"):
        write_clip_shards(tmp_path / "a", _records(1), fps=24.0)


def test_a_silently_decoding_bit_flip_in_a_written_clip_is_refused_naming_the_member(tmp_path):
    """H.264 has no checksum: the flipped bit below decodes without an error, to other pixels. The
    SHA-256 the writer recorded in the json catches it, in training's reader and in validate --data."""
    paths = write_clip_shards(tmp_path, _records(2), fps=24.0)
    with tarfile.open(paths[0]) as tar:
        clip = tar.extractfile("00000001.mp4").read()
    damaged = flip_member_byte(paths[0], "00000001.mp4", silent_flip(clip, 9, 32, 32))
    assert not np.array_equal(decode_clip(damaged, 9, 32, 32, "x"), decode_clip(clip, 9, 32, 32, "x"))  # FFmpeg: no error
    source = CaptionShards([str(paths[0])], MediaSpec(9, 32, 32))
    assert source[0].caption == "clip number 0"  # the sound sample still reads
    with pytest.raises(UserError) as refused:
        source[1]
    message = str(refused.value)
    assert message.startswith(f"{paths[0]} sample '00000001': member 'mp4' is damaged: its SHA-256 is "
                              f"{hashlib.sha256(damaged).hexdigest()}, the sample's json records {hashlib.sha256(clip).hexdigest()}")
    assert "write the shards again" in message and "\n" not in message

    class Data:
        shards, jsonl = [str(paths[0])], ""

    problems, _ = scan.check_captions(Data(), tmp_path, False, (9, 32, 32))
    assert [p.render() for p in problems] == [f"rl.data.shards: {message}"]


def test_clip_shards_without_recorded_digests_read_as_before_and_bad_digest_fields_are_refused(tmp_path):
    """Shards whose json records no sha256 (older ones, a user's own) are read unverified; a sha256
    field that is not the project's mapping, or names a member the sample lacks, is refused."""
    clip = squares_mp4()

    def shard(name, meta):
        path = tmp_path / name
        with tarfile.open(path, "w") as tar:
            for member, data in [("k0.mp4", clip), ("k0.json", json.dumps({"caption": "a clip", **meta}).encode())]:
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    plain = shard("plain.tar", {})
    damaged = flip_member_byte(plain, "k0.mp4", silent_flip(clip, 9, 32, 32))
    read = CaptionShards(str(plain), MediaSpec(9, 32, 32))[0].image  # unverified: decodes as FFmpeg decodes it
    assert torch.equal(read, decode_clip(damaged, 9, 32, 32, "x"))
    for meta, needle in [
        ({"sha256": "0" * 64}, "json field 'sha256' must map member names"),
        ({"sha256": {"mp4": "ABC"}}, "json field 'sha256' must map member names"),
        ({"sha256": {"winner.mp4": "0" * 64}}, "json field 'sha256' records a digest for 'winner.mp4', a member the sample does not hold"),
    ]:
        with pytest.raises(UserError, match=rf"bad\.tar sample 'k0': {needle}"):
            CaptionShards(str(shard("bad.tar", meta)), MediaSpec(9, 32, 32))
        (tmp_path / "bad.tar").unlink()


def test_shards_read_a_one_frame_clip_as_an_image_and_refuse_images_for_clips(tmp_path):
    one = write_clip_shards(tmp_path / "one", _records(2, frames=1), fps=24.0)
    sample = caption_source([str(one[0])], "", MediaSpec.image(32))[1]
    assert sample.image.shape == (3, 32, 32)
    assert torch.equal(sample.image, torch.from_numpy(np.roll(squares_clip(1), 1, axis=2)[0]).permute(2, 0, 1).float() / 255)
    images = tmp_path / "images.tar"
    with tarfile.open(images, "w") as tar:
        for name, data in [("k0.png", png_bytes()), ("k0.txt", b"a red square")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UserError, match=r"images\.tar sample 'k0': an image, but clips of 9 frames are expected"):
        CaptionShards(str(images), MediaSpec(9, 32, 32))
    assert CaptionShards(str(images), MediaSpec.image(8))[0].image.shape == (3, 8, 8)  # images read as before


def test_jsonl_rows_name_clips_in_a_video_field(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "a.mp4").write_bytes(squares_mp4())
    (tmp_path / "clips" / "few.mp4").write_bytes(squares_mp4(5))
    (tmp_path / "a.png").write_bytes(png_bytes(size=32))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"video": "clips/a.mp4", "caption": "a red square moving right"}\n{"video": "clips/few.mp4", "caption": "c", "id": "few"}\n')
    source = CaptionJsonl(rows, MediaSpec(9, 32, 32))
    assert source[0].image.shape == (3, 9, 32, 32) and source[0].caption == "a red square moving right"
    with pytest.raises(UserError, match=r"rows\.jsonl:2 \(id 'few'\): .*few\.mp4: too few frames: the clip declares 5"):
        source[1]
    for text, message in [
        ('{"video": "clips/gone.mp4", "caption": "c"}', r"bad\.jsonl:1: clip .*gone\.mp4 does not exist"),
        ('{"image": "a.png", "caption": "c"}', r"bad\.jsonl:1: an image, but clips of 9 frames are expected .*'video'"),
        ('{"video": 3, "caption": "c"}', r"bad\.jsonl:1: field 'video' must be a clip \(mp4\) path string, found 3"),
    ]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text + "\n")
        with pytest.raises(UserError, match=message):
            CaptionJsonl(bad, MediaSpec(9, 32, 32))


# ------------------------------------------------------------------------------ validate --data
def test_the_scan_lists_every_bad_clip_of_shards_with_shard_and_key(tmp_path):
    paths = write_clip_shards(tmp_path, _records(2), fps=24.0)
    with tarfile.open(paths[0], "a") as tar:  # a third sample with too few frames, a fourth a bomb
        for key, data in [("00000002", squares_mp4(5)), ("00000003", with_declared_frames(GOOD, 1_000_000))]:
            for name, member in [(f"{key}.mp4", data), (f"{key}.txt", b"a caption")]:
                info = tarfile.TarInfo(name)
                info.size = len(member)
                tar.addfile(info, io.BytesIO(member))

    class Data:
        shards, jsonl = [str(paths[0])], ""

    problems, notes = scan.check_captions(Data(), tmp_path, False, (9, 32, 32))
    texts = [p.render() for p in problems]
    assert len(texts) == 2, texts
    assert f"{paths[0]} sample '00000002': too few frames" in texts[0]
    assert f"{paths[0]} sample '00000003': cannot decode clip: too long to decode safely" in texts[1]
    assert notes == ["rl.data.shards: 1 shard(s), 4 good samples, 0 problem(s); clips of all 4 rows opened"]
    at_five = [p.render() for p in scan.check_captions(Data(), tmp_path, False, (5, 32, 32))[0]]
    assert ["too many frames: the clip declares 9" in t for t in at_five] == [True, True, False], at_five


def test_clips_are_sampled_as_images_are(tmp_path):
    (tmp_path / "good.mp4").write_bytes(GOOD)
    (tmp_path / "few.mp4").write_bytes(squares_mp4(5))
    count = 200
    bad = next(i for i in range(count) if i not in set(scan.sample_rows(count, full=False)))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"video": "few.mp4" if i == bad else "good.mp4", "caption": "c", "id": f"r{i}"}) + "\n" for i in range(count)))

    class Data:
        shards, jsonl = [], str(rows)

    problems, notes = scan.check_captions(Data(), tmp_path, False, (9, 32, 32))
    assert problems == [] and "clips of 128 of 200 rows opened" in notes[0] and "--data all opens every clip" in notes[0]
    problems, _ = scan.check_captions(Data(), tmp_path, True, (9, 32, 32))
    assert [p.render() for p in problems] == [
        f"rl.data.jsonl: {rows}:{bad + 1} (id 'r{bad}'): {tmp_path / 'few.mp4'}: too few frames: the clip declares 5, "
        "expected exactly 9; give it 9 frames or change the frame count"
    ]


def test_validate_data_exits_2_naming_every_bad_clip_row(tmp_path):
    """Through the CLI, before anything starts, for a 9-frame run (model.num_frames = 9)."""
    files = {
        "good.mp4": GOOD,
        "bomb.mp4": with_declared_frames(GOOD, 1_000_000),
        "wide.mp4": encode_clip(squares_clip(9, 32, 48), 24.0),
        "corrupt.mp4": with_damaged_samples(GOOD),
        "five.mp4": encode_clip(squares_clip(5), 24.0),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    rows = tmp_path / "clips.jsonl"
    rows.write_text("".join(json.dumps({"video": name, "caption": "a red square", "id": name}) + "\n" for name in files))
    args = ["validate", SFT, "rl.data.shards=[]", f'rl.data.jsonl="{rows}"', "model.num_frames=9", "rl.eval.every=0"]
    result = cosmos(*args, cwd=ROOT)  # in-process (tests/_inproc.py): the exit code and the lines are the subject
    assert result.returncode == 2, result.stdout + result.stderr
    expected = {
        2: "bomb.mp4: cannot decode clip: too long to decode safely (declares 1000000 frames",
        3: "wide.mp4: wrong clip size: 48x32",
        4: "corrupt.mp4: cannot decode clip: damaged video stream",
        5: "five.mp4: too few frames: the clip declares 5, expected exactly 9",
    }
    lines = [line for line in result.stderr.splitlines() if line.startswith("  rl.data.jsonl: ")]
    assert len(lines) == len(expected), result.stderr
    for number, text in expected.items():
        assert any(f"{rows}:{number} (id " in line and text in line for line in lines), (number, result.stderr)
    assert "Traceback" not in result.stderr
    rows.write_text(json.dumps({"video": "good.mp4", "caption": "a red square"}) + "\n")
    ok = cosmos(*args, cwd=ROOT)
    assert ok.returncode == 0 and "rl.data.jsonl: 1 good rows, 0 bad; clips of all 1 rows opened" in ok.stdout, ok.stdout + ok.stderr
