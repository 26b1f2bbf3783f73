"""Clip files (mp4) with PyAV: the one encoder and the one guarded decoder of the project; torch-free.

Encoding (:func:`encode_clip`): H.264 through ``libx264rgb`` at ``qp 0`` on ``rgb24`` frames, in an
mp4. That is lossless: the decoded frames equal the encoded ones bit for bit, at any size (no
chroma subsampling, so odd sides are fine). One thread and FFmpeg's ``bitexact`` muxing, so the same
frames give the same bytes for one PyAV build.

Decoding (:func:`read_clip`, and :func:`check_clip` for ``validate``, which decodes the same way and
keeps nothing; :func:`read_clip_span` for a span of a longer clip, as LeRobot datasets store episodes) reads any codec FFmpeg decodes from an mp4/mov container, but trusts none of its
metadata for allocation. In this order, each refusal a ``UserError`` naming ``origin`` (the file and
row, or the shard and key):

1. the container opens as mp4/mov (no probing into other formats; external data references off,
   FFmpeg's default) and holds exactly one video stream (audio and other streams are ignored);
2. the frame size the stream declares is at most :data:`MAX_CLIP_PIXELS` (a decoding bomb is refused
   here, before a frame is decoded; FFmpeg's own probing decode is capped at the same limit) and
   equals the expected height x width (clips are never resized);
3. the frame count it declares (when it declares one) is at most :data:`MAX_CLIP_FRAMES` and equals
   the expected count;
4. then frames are decoded one at a time: each must decode cleanly, have the expected size and no
   display rotation; decoding stops at one frame past the expected count.

**Frame count rule**: a clip must hold exactly the expected number of frames. Too few is refused,
and so is too many (the first F frames are not taken): a clip cut for another frame count shows a
different motion than its caption says, and the Wan VAE needs exactly F = 4k+1 frames anyway. The
fix is to re-cut the clips (``ffmpeg -i in.mp4 -frames:v F out.mp4``) or change the frame count.
The frame rate is not checked.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import BinaryIO, Iterator, Union

import av
import av.error
import numpy as np

from cosmos_rl.core.errors import UserError

# Per frame. 3840 x 2160 (4K UHD, 8.3 M) fits; one decoded frame at the limit is 25 MB of RGB.
MAX_CLIP_PIXELS = 1 << 23
# Declared frames; ~7 minutes at 24 fps. A clip that claims more is refused before decoding.
MAX_CLIP_FRAMES = 10_000
ENCODER = "libx264rgb"
ENCODER_PIX_FMT = "rgb24"
ENCODER_OPTIONS = {"qp": "0"}  # lossless
FIX = "re-encode it as an mp4 of exactly the expected frames and size (see docs/data.md, \"Clip files\")"

ClipData = Union[bytes, bytearray, BinaryIO]
# FFmpeg's limit on any decoded picture, given to the probing decode at open and to ours.
_DECODER_LIMIT = {"max_pixels": str(MAX_CLIP_PIXELS)}


def _rate(fps: float) -> Fraction:
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return Fraction(fps).limit_denominator(1001 * 1000)


def encode_clip(frames: np.ndarray, fps: float) -> bytes:
    """uint8 frames [F, H, W, 3] as lossless H.264 mp4 bytes (see the module docstring)."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or 0 in frames.shape:
        raise ValueError(f"encode_clip expects uint8 [F>0, H>0, W>0, 3], got {frames.dtype} {frames.shape}")
    count, height, width, _ = frames.shape
    if height * width > MAX_CLIP_PIXELS or count > MAX_CLIP_FRAMES:
        raise ValueError(f"a clip of {count} x {height} x {width} is over MAX_CLIP_FRAMES or MAX_CLIP_PIXELS")
    rate = _rate(fps)
    buffer = io.BytesIO()
    # bitexact: no library version strings in the container, so the bytes depend on the frames only.
    with av.open(buffer, mode="w", format="mp4", container_options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(ENCODER, rate=rate, options=dict(ENCODER_OPTIONS))
        stream.width, stream.height, stream.pix_fmt = width, height, ENCODER_PIX_FMT
        stream.codec_context.thread_count = 1  # x264's threads split the picture differently run to run
        stream.codec_context.time_base = 1 / rate
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def _ffmpeg_text(exc: Exception) -> str:
    """FFmpeg's reason without the call it came from (which names no file and helps nobody)."""
    return str(getattr(exc, "strerror", None) or exc)


def _open(data: ClipData, origin: str):
    source = io.BytesIO(bytes(data)) if isinstance(data, (bytes, bytearray)) else data
    try:
        return av.open(source, mode="r", format="mp4", options=dict(_DECODER_LIMIT))
    except av.error.FFmpegError as exc:  # first: FFmpeg's errors are ValueErrors too
        raise UserError(f"{origin}: cannot open clip: not a readable mp4/mov container ({_ffmpeg_text(exc)}); {FIX}") from exc
    except ValueError as exc:  # PyAV refuses per-stream options when FFmpeg found no track at all
        raise UserError(f"{origin}: cannot open clip: no tracks found (empty, cut short, damaged or not an mp4); {FIX}") from exc


def _video_stream(container, origin: str):
    videos = list(container.streams.video)
    if len(videos) != 1:
        raise UserError(f"{origin}: cannot open clip: {len(videos)} video streams, expected exactly one; {FIX}")
    stream = videos[0]
    if stream.codec_context is None:
        raise UserError(f"{origin}: cannot open clip: no decoder for its video codec; re-encode it with H.264")
    return stream


def _check_declared(stream, frames: int, height: int, width: int, origin: str) -> None:
    """Everything the header says, judged before a single frame is decoded."""
    declared_w, declared_h = stream.codec_context.width, stream.codec_context.height
    if declared_w * declared_h > MAX_CLIP_PIXELS:
        raise UserError(
            f"{origin}: cannot decode clip: too large to decode safely (declares {declared_w}x{declared_h} = "
            f"{declared_w * declared_h} pixels per frame, the limit is {MAX_CLIP_PIXELS}); re-encode it at {width}x{height}"
        )
    if declared_w <= 0 or declared_h <= 0:
        raise UserError(f"{origin}: cannot decode clip: the video stream declares no frame size (damaged header); {FIX}")
    if (declared_h, declared_w) != (height, width):
        raise UserError(
            f"{origin}: wrong clip size: {declared_w}x{declared_h} (width x height), expected {width}x{height}; "
            f"clips are not resized: re-encode it at {width}x{height}"
        )
    declared = int(stream.frames or 0)  # 0: the container does not say
    if declared > MAX_CLIP_FRAMES:
        raise UserError(
            f"{origin}: cannot decode clip: too long to decode safely (declares {declared} frames, the limit is "
            f"{MAX_CLIP_FRAMES}); cut it to {frames} frames"
        )
    if declared and declared != frames:
        raise UserError(_count_problem(origin, declared, frames, "declares"))


def _count_problem(origin: str, found: int, frames: int, verb: str) -> str:
    if found < frames:
        return (f"{origin}: too few frames: the clip {verb} {found}, expected exactly {frames}; "
                f"give it {frames} frames or change the frame count")
    return (f"{origin}: too many frames: the clip {verb} {found}, expected exactly {frames} (clips are not cut); "
            f"re-cut it to {frames} frames (e.g. ffmpeg -i in.mp4 -frames:v {frames} out.mp4) or change the frame count")


def _decoded_frames(data: ClipData, frames: int, height: int, width: int, origin: str) -> Iterator:
    """The clip's frames as PyAV frames, after every check of the module docstring; stops one past `frames`."""
    if frames < 1 or height < 1 or width < 1:
        raise ValueError(f"expected frames, height and width must be positive, got {frames}, {height}, {width}")
    with _open(data, origin) as container:
        stream = _video_stream(container, origin)
        _check_declared(stream, frames, height, width, origin)
        stream.codec_context.thread_count = 1
        stream.codec_context.options = dict(_DECODER_LIMIT)
        count = 0
        try:
            for frame in container.decode(stream):
                count += 1
                if count > frames:
                    raise UserError(_count_problem(origin, count, frames, "holds at least"))
                if frame.is_corrupt:
                    raise UserError(f"{origin}: cannot decode clip: frame {count} is damaged (corrupt stream); {FIX}")
                if (frame.height, frame.width) != (height, width):
                    raise UserError(
                        f"{origin}: wrong clip size: frame {count} is {frame.width}x{frame.height}, expected "
                        f"{width}x{height}; re-encode it at {width}x{height}"
                    )
                if frame.rotation:
                    raise UserError(f"{origin}: the clip is tagged to display rotated by {frame.rotation} degrees; "
                                    "re-encode it upright (frames are read as stored)")
                yield frame
        except av.error.FFmpegError as exc:
            raise UserError(f"{origin}: cannot decode clip: damaged video stream after {count} good frame(s) "
                            f"({_ffmpeg_text(exc)}); {FIX}") from exc
        if count < frames:
            raise UserError(_count_problem(origin, count, frames, "decodes to"))


def read_clip(data: ClipData, frames: int, height: int, width: int, origin: str) -> np.ndarray:
    """Decode a clip to uint8 [frames, height, width, 3] RGB, or raise a ``UserError`` naming ``origin``."""
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    for index, frame in enumerate(_decoded_frames(data, frames, height, width, origin)):
        # The frame's own colour range: a full-range (JPEG) source read as limited would lose contrast.
        out[index] = frame.to_ndarray(format="rgb24", src_color_range=frame.color_range)
    return out


def check_clip(data: ClipData, frames: int, height: int, width: int, origin: str) -> None:
    """Open and decode a clip as :func:`read_clip` does, keeping no pixels (`validate`'s check)."""
    for _ in _decoded_frames(data, frames, height, width, origin):
        pass


def read_clip_span(data: ClipData, start: float, count: int, fps: float, height: int, width: int,
                   origin: str) -> np.ndarray:
    """The `count` frames shown from `start` seconds on, uint8 [count, height, width, 3], from a clip that
    may hold more (LeRobot's video files: one episode per file in v2.1, many back to back in v3.0).

    The same guards as :func:`read_clip` (one video stream, the declared size judged before decoding,
    every frame clean, upright and of the expected size), but the clip's declared frame count is not
    compared: a frame belongs to the span when its timestamp lies within half a frame (at `fps`) of
    ``start + k / fps`` for k in ``0 .. count - 1``. The span must hold exactly `count` frames; decoding
    starts at the keyframe before `start` (a seek) and stops at the span's end.
    """
    if not 1 <= count <= MAX_CLIP_FRAMES or height < 1 or width < 1 or not fps > 0 or not start >= 0:
        raise ValueError(f"a span of {count} frames of {width}x{height} from {start}s at {fps} fps is out of range")
    half = 0.5 / fps
    end = start + count / fps - half  # the first timestamp past the span
    out = np.empty((count, height, width, 3), dtype=np.uint8)
    found = 0
    with _open(data, origin) as container:
        stream = _video_stream(container, origin)
        declared_w, declared_h = stream.codec_context.width, stream.codec_context.height
        if declared_w * declared_h > MAX_CLIP_PIXELS or (declared_h, declared_w) != (height, width):
            raise UserError(f"{origin}: wrong video size: {declared_w}x{declared_h} (width x height), expected "
                            f"{width}x{height} as the dataset declares; re-encode the video at {width}x{height}")
        stream.codec_context.thread_count = 1
        stream.codec_context.options = dict(_DECODER_LIMIT)
        try:
            if start > half and stream.time_base:
                container.seek(int(start / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                when = frame.time
                if when is None:
                    raise UserError(f"{origin}: the video's frames carry no timestamps, so an episode's frames cannot be "
                                    f"found in it; {FIX}")
                if when < start - half:
                    continue
                if when >= end:
                    break
                found += 1
                if found > count:
                    break  # one too many: a video at a higher rate than the table's
                if frame.is_corrupt:
                    raise UserError(f"{origin}: cannot decode video: frame {found} of the span is damaged; {FIX}")
                if (frame.height, frame.width) != (height, width) or frame.rotation:
                    raise UserError(f"{origin}: frame {found} of the span is {frame.width}x{frame.height} rotated "
                                    f"{frame.rotation or 0} degrees, expected {width}x{height} upright; {FIX}")
                out[found - 1] = frame.to_ndarray(format="rgb24", src_color_range=frame.color_range)
        except av.error.FFmpegError as exc:
            raise UserError(f"{origin}: cannot decode video: damaged stream after {found} good frame(s) of the span "
                            f"({_ffmpeg_text(exc)}); {FIX}") from exc
    if found != count:
        more = "at least " if found > count else ""
        raise UserError(f"{origin}: the video holds {more}{found} frame(s) from {start:.3f}s to {start + count / fps:.3f}s "
                        f"at {fps:g} fps, the table {count}; rewrite the episode so its video and table agree")
    return out
