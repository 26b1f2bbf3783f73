"""What a run generates and trains on, as one value: frames x height x width at a frame rate.

`MediaSpec` is built once from the manifest (`MediaSpec.from_model_config`) and handed to
everything that needs a size: prompt templates, data readers, samplers, the evaluator. An image
is one frame. `latent_shape` turns it into the shape of one sample's latents, (C, T, h, w), from
what the VAE's network does (its downsampling stages and patchify), not from the scale factors its
config declares: a config may claim a compression its network does not do.

Torch-free: configs are read as attribute bags (a diffusers FrozenDict or anything with the names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The stock pipeline's default frame rate (`Cosmos3OmniPipeline.__call__(fps=24.0)`). A single
# frame has no time axis to modulate, so for images it plays no part in any number.
DEFAULT_FPS = 24.0
# AutoencoderKLWan encodes frame 0 alone, then chunks of exactly 4 frames (`_encode`).
_WAN_FRAME_CHUNK = 4


@dataclass(frozen=True)
class MediaSpec:
    """`frames` x `height` x `width` pixels per sample, played at `fps` (1 frame: an image)."""

    frames: int
    height: int
    width: int
    fps: float = DEFAULT_FPS

    def __post_init__(self) -> None:
        if min(self.frames, self.height, self.width) < 1 or not self.fps > 0:
            raise ValueError(f"a media spec needs positive frames, height, width and fps, got {self}")

    @classmethod
    def image(cls, height: int, width: int | None = None) -> "MediaSpec":
        """One frame of `height` x `width` (square when `width` is None)."""
        return cls(frames=1, height=int(height), width=int(height if width is None else width))

    @classmethod
    def from_model_config(cls, model: Any) -> "MediaSpec":
        """The media of a manifest's `[model]` table (`schema.ModelConfig`, preflighted): `height` and
        `width` when given, else the square `image_size`; `num_frames` at `fps`."""
        height = model.height if model.height is not None else model.image_size
        width = model.width if model.width is not None else model.image_size
        if height is None or width is None:
            raise ValueError(f"model config gives no complete size: image_size {model.image_size}, height {model.height}, width {model.width}")
        frames = int(getattr(model, "num_frames", 1))
        fps = float(getattr(model, "fps", DEFAULT_FPS))
        return cls(frames=frames, height=int(height), width=int(width), fps=fps)

    @property
    def is_video(self) -> bool:
        """More than one frame: the pipeline's video templates, time positions and clip pixels."""
        return self.frames > 1

    @property
    def seconds(self) -> float:
        """How long a clip plays (the pipeline's duration sentence: frames / fps)."""
        return self.frames / self.fps

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of every frame."""
        return self.height, self.width

    def size_json(self) -> int | list[int]:
        """The frame size as result files record it: the side of a square, else [height, width]."""
        return self.height if self.height == self.width else [self.height, self.width]


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def vae_spatial_factor(vae_config: Any) -> int:
    """Pixels per latent cell along height and width: 2 per downsampling stage of the Wan encoder
    (every stage but the last), times its patchify side."""
    stages = len(_get(vae_config, "dim_mult")) - 1
    return 2**stages * int(_get(vae_config, "patch_size") or 1)


def vae_temporal_factor(vae_config: Any) -> int:
    """Frames per latent frame: 2 per stage whose `temperal_downsample` flag is set (the Wan encoder
    reads the flags of every stage but the last, the one that does not downsample)."""
    stages = len(_get(vae_config, "dim_mult")) - 1
    return 2 ** sum(bool(flag) for flag in list(_get(vae_config, "temperal_downsample"))[:stages])


def is_wan_frame_count(frames: int) -> bool:
    """1 (an image) or 4k + 1 (a clip the Wan encoder reads whole: frame 0, then chunks of 4)."""
    return frames >= 1 and (frames - 1) % _WAN_FRAME_CHUNK == 0


def latent_frames(frames: int, temporal_factor: int) -> int:
    """Latent frames the Wan encoder makes of `frames`: frame 0 alone, then 4 / temporal_factor per
    chunk of 4 frames (it silently drops frames past the last whole chunk, so only 4k + 1 is exact)."""
    if frames == 1:
        return 1
    if (frames - 1) % _WAN_FRAME_CHUNK or _WAN_FRAME_CHUNK % temporal_factor:
        raise ValueError(
            f"{frames} frames at {temporal_factor}x temporal compression: the Wan VAE encodes 4k + 1 frames "
            "with a temporal factor of 1, 2 or 4"
        )
    return 1 + (frames - 1) // temporal_factor


def latent_shape(media: MediaSpec, vae_config: Any, transformer_config: Any) -> tuple[int, int, int, int]:
    """(C, T, h, w) of one sample's latents: C the transformer's latent channels, T the latent
    frames, h x w the frame size over the VAE's spatial factor."""
    spatial = vae_spatial_factor(vae_config)
    if media.height % spatial or media.width % spatial:
        raise ValueError(f"{media.height}x{media.width} pixels do not divide into the VAE's {spatial}x{spatial} latent cells")
    channels = int(_get(transformer_config, "latent_channel"))
    frames = latent_frames(media.frames, vae_temporal_factor(vae_config))
    return channels, frames, media.height // spatial, media.width // spatial


def frame_timing(media: MediaSpec, vae_config: Any) -> dict:
    """The packed forward's time keywords for `media` (`models.packing.velocity`): a clip's frame
    rate and the VAE's temporal compression; nothing for an image (one frame is never modulated)."""
    if not media.is_video:
        return {}
    return {"fps": media.fps, "temporal_factor": vae_temporal_factor(vae_config)}
