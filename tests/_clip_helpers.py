"""Clip bytes for data tests: a synthetic clip of moving coloured squares, and hostile mp4 files made
from a real one by editing its boxes (a header that claims a million frames, an H.264 parameter set
that declares a huge picture, damaged sample data)."""

from __future__ import annotations

import io
import struct

import av
import numpy as np

from cosmos_rl.data.clip_files import encode_clip

COLOURS = [(255, 0, 0), (0, 0, 255), (0, 200, 0), (255, 255, 0), (255, 128, 0), (128, 0, 255)]


def squares_clip(frames: int = 9, height: int = 32, width: int = 32) -> np.ndarray:
    """uint8 [F, H, W, 3]: a grey background, a red square moving right, a blue one bobbing down and
    a small one changing colour every frame (flat colours with hard edges, as the shapes world draws)."""
    clip = np.full((frames, height, width, 3), 40, dtype=np.uint8)
    for t in range(frames):
        left = (2 + 2 * t) % max(1, width - 8)
        clip[t, 4:12, left : left + 8] = COLOURS[0]
        clip[t, 18 + t % 3 : 26 + t % 3, width - 12 : width - 4] = COLOURS[1]
        clip[t, 10:14, 14:18] = COLOURS[t % len(COLOURS)]
    return clip


def squares_mp4(frames: int = 9, height: int = 32, width: int = 32) -> bytes:
    return encode_clip(squares_clip(frames, height, width), fps=24.0)


# --------------------------------------------------------------------------------- mp4 boxes
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"dinf", b"udta"}


def boxes(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[bytes, int, int]]:
    """(type, offset, size) of every box, parents before children (enough of ISO BMFF for our files)."""
    end = len(data) if end is None else end
    found = []
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        found.append((kind, at, size))
        if kind in _CONTAINERS:
            found += boxes(data, at + 8, at + size)
        elif kind == b"stsd":  # full box header + entry count, then sample entries
            found += boxes(data, at + 16, at + size)
        elif kind == b"avc1":  # 78 bytes of visual sample entry, then its boxes (avcC, ...)
            found += boxes(data, at + 8 + 78, at + size)
        at += size
    return found


def box(data: bytes, kind: bytes) -> tuple[int, int]:
    return next((offset, size) for k, offset, size in boxes(data) if k == kind)


def with_declared_frames(mp4: bytes, count: int) -> bytes:
    """The stts box's one entry claims `count` samples: the stream's frame count FFmpeg reports."""
    offset, _ = box(mp4, b"stts")
    out = bytearray(mp4)
    assert struct.unpack_from(">I", out, offset + 12)[0] == 1, "expected one stts entry"
    struct.pack_into(">I", out, offset + 16, count)
    return bytes(out)


def with_sample_entry_size(mp4: bytes, width: int, height: int) -> bytes:
    """The avc1 sample entry's 16-bit width and height fields."""
    offset, _ = box(mp4, b"avc1")
    out = bytearray(mp4)
    struct.pack_into(">HH", out, offset + 32, width, height)
    return bytes(out)


def with_rotation(mp4: bytes) -> bytes:
    """The track header's display matrix turned a quarter (what a phone writes for portrait footage)."""
    offset, _ = box(mp4, b"tkhd")
    out = bytearray(mp4)
    # version 0: after the box header, version/flags, times, track id, duration, layer, volume: 40 bytes
    struct.pack_into(">9i", out, offset + 8 + 40, 0, 1 << 16, 0, -(1 << 16), 0, 0, 0, 0, 1 << 30)
    return bytes(out)


def with_damaged_samples(mp4: bytes, step: int = 7) -> bytes:
    """Every `step`-th byte of the coded frames (mdat) flipped."""
    offset, size = box(mp4, b"mdat")
    out = bytearray(mp4)
    for at in range(offset + 8 + 40, offset + size, step):
        out[at] ^= 0x5A
    return bytes(out)


# ------------------------------------------------------------------ H.264 sequence parameter set
def _unescape(nal: bytes) -> bytes:
    out, zeros = bytearray(), 0
    for byte in nal:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def _escape(rbsp: bytes) -> bytes:
    out, zeros = bytearray(), 0
    for byte in rbsp:
        if zeros >= 2 and byte <= 3:
            out.append(3)
            zeros = 0
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


class _Bits:
    def __init__(self, data: bytes):
        self.bits, self.at = "".join(f"{byte:08b}" for byte in data), 0

    def u(self, n: int) -> int:
        value = int(self.bits[self.at : self.at + n], 2)
        self.at += n
        return value

    def ue(self) -> int:
        zeros = 0
        while self.bits[self.at] == "0":
            zeros += 1
            self.at += 1
        self.at += 1
        value = (1 << zeros) - 1 + (int(self.bits[self.at : self.at + zeros], 2) if zeros else 0)
        self.at += zeros
        return value


def _ue(value: int) -> str:
    code = bin(value + 1)[2:]
    return "0" * (len(code) - 1) + code


def _resized_sps(nal: bytes, width: int, height: int) -> bytes:
    """The SPS NAL with pic_width_in_mbs and pic_height_in_map_units replaced (progressive, as x264 writes)."""
    bits = _Bits(_unescape(nal[1:]))
    profile = bits.u(8)
    bits.u(16)  # constraint flags, level
    bits.ue()  # seq_parameter_set_id
    if profile in (100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135):
        if bits.ue() == 3:  # chroma_format_idc 4:4:4
            bits.u(1)
        bits.ue(), bits.ue(), bits.u(1)  # bit depths, qpprime_y_zero_transform_bypass
        assert bits.u(1) == 0, "scaling matrices not handled"
    bits.ue()  # log2_max_frame_num_minus4
    if bits.ue() == 0:  # pic_order_cnt_type
        bits.ue()
    bits.ue(), bits.u(1)  # max_num_ref_frames, gaps_in_frame_num_allowed
    start = bits.at
    bits.ue(), bits.ue()
    rest = bits.bits[bits.at :].rstrip("0")  # up to the stop bit
    new = bits.bits[:start] + _ue(width // 16 - 1) + _ue(height // 16 - 1) + rest
    new += "0" * (-len(new) % 8)
    return nal[:1] + _escape(int(new, 2).to_bytes(len(new) // 8, "big"))


def with_sps_size(mp4: bytes, width: int, height: int) -> bytes:
    """The clip with its H.264 SPS (in avcC) declaring width x height; every enclosing box's size is
    fixed up. The moov box follows mdat in FFmpeg's mp4s, so no sample offset moves."""
    found = boxes(mp4)
    offset, size = next((o, s) for k, o, s in found if k == b"avcC")
    assert offset > box(mp4, b"mdat")[0], "moov must follow mdat"
    payload = mp4[offset + 8 : offset + size]
    length = struct.unpack(">H", payload[6:8])[0]
    sps = _resized_sps(payload[8 : 8 + length], width, height)
    new_payload = payload[:6] + struct.pack(">H", len(sps)) + sps + payload[8 + length :]
    delta = len(new_payload) - len(payload)
    out = bytearray(mp4[:offset] + struct.pack(">I", size + delta) + b"avcC" + new_payload + mp4[offset + size :])
    for kind, parent, parent_size in found:
        if kind != b"avcC" and parent < offset and parent + parent_size >= offset + size:
            struct.pack_into(">I", out, parent, parent_size + delta)
    return bytes(out)


def two_video_streams() -> bytes:
    """An mp4 with two video tracks of the same 9 frames."""
    buffer = io.BytesIO()
    clip = squares_clip()
    with av.open(buffer, mode="w", format="mp4") as container:
        streams = [container.add_stream("libx264rgb", rate=24, options={"qp": "0"}) for _ in range(2)]
        for stream in streams:
            stream.width, stream.height, stream.pix_fmt = 32, 32, "rgb24"
        for pixels in clip:
            for stream in streams:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        for stream in streams:
            container.mux(stream.encode(None))
    return buffer.getvalue()


# ------------------------------------------------------------------------ silent slice damage
def silent_flip(mp4: bytes, frames: int, height: int, width: int) -> int:
    """The offset in `mp4` of a byte inside its coded frames (mdat) whose one flipped bit FFmpeg
    decodes without an error, to different pixels: the damage only a checksum catches. Searched
    from the end of the slice data back (the last frames' slices), so the same file gives the same
    byte; found by decoding with the project's own decoder, not assumed."""
    from cosmos_rl.data.clips import decode_clip

    good = decode_clip(mp4, frames, height, width, "probe")
    offset, size = box(mp4, b"mdat")
    for at in range(offset + size - 1, offset + 8, -1):
        damaged = bytearray(mp4)
        damaged[at] ^= 0x01
        try:
            pixels = decode_clip(bytes(damaged), frames, height, width, "probe")
        except Exception:  # noqa: BLE001 - a flip FFmpeg reports is not the one sought
            continue
        if not bool((pixels == good).all()):
            return at
    raise AssertionError("no silently decoding bit flip in this clip's slice data")


def flip_member_byte(shard, name: str, at: int) -> bytes:
    """Flip bit 0 of byte `at` of tar member `name` in place in `shard`; returns the member's new bytes."""
    import tarfile

    with tarfile.open(shard) as tar:
        start = tar.getmember(name).offset_data
    with open(shard, "r+b") as handle:
        handle.seek(start + at)
        byte = handle.read(1)[0]
        handle.seek(start + at)
        handle.write(bytes([byte ^ 0x01]))
    with tarfile.open(shard) as tar:
        return tar.extractfile(name).read()
