"""Preflight of what a sample is: frame size, frames, frame rate and their agreement with the model's VAE.

The Wan VAE's encoder reads frame 0 alone and then chunks of exactly 4 frames, whatever its
`temperal_downsample` says, and silently drops frames past the last whole chunk (the stock pipeline
does not check), so a clip has 4k + 1 frames. Its latent frames are 1 + (F - 1) * 2^n / 4 with n
the stages whose temporal flag is set; the pipeline spaces latent frames in time by the config's
`scale_factor_temporal`, so that must be 2^n, and the frame size a multiple of the spatial factor.
Torch-free: a model folder's `transformer/config.json` and `vae/config.json` are read as bounded JSON.
"""

from __future__ import annotations

import math
from pathlib import Path

from cosmos_rl.checkpoint.weight_files import FolderProblem, config_problem, read_config
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.core.media import DEFAULT_FPS, is_wan_frame_count, vae_spatial_factor, vae_temporal_factor
from cosmos_rl.models.folder_check import TRANSFORMER_BOUNDS, VAE_BOUNDS
from cosmos_rl.models.layout import read_json

VAE_CONFIG = Path("vae") / "config.json"


def _nearest_valid(frames: int) -> str:
    below = frames - (frames - 1) % 4
    return f"{below} or {below + 4}" if below >= 5 else f"{below + 4}"


def frame_size(m: schema.ModelConfig) -> tuple[int | None, int | None]:
    """(height, width) of a frame: model.height/width, else the square model.image_size."""
    return (m.height if m.height is not None else m.image_size, m.width if m.width is not None else m.image_size)


def size_rules(m: schema.ModelConfig, r: Rules) -> None:
    # image_size is the square shorthand for height = width: one or the other, each a multiple of 16.
    given = [k for k, v in (("model.height", m.height), ("model.width", m.width)) if v is not None]
    if m.image_size is not None and given:
        r.error("model.image_size", f"given together with {' and '.join(given)}", m.image_size,
                f"give model.image_size (a square) or model.height and model.width, not both: remove model.image_size or {' and '.join(given)}")
    elif m.image_size is None and len(given) == 1:
        missing = "model.width" if given == ["model.height"] else "model.height"
        r.error(missing, f"missing: {given[0]} is set, and the size needs both sides",
                fix=f"set {missing} too (or only model.image_size, for a square image)")
    for key, value in (("model.image_size", m.image_size), ("model.height", m.height), ("model.width", m.width)):
        if value is not None and (value < 16 or value % 16):
            r.error(key, "must be a multiple of 16, at least 16", value, "use e.g. 32 or 512")


def frame_rules(m: schema.ModelConfig, r: Rules) -> None:
    """num_frames and fps on their own: at least one frame, 4k + 1 for video, a positive finite
    fps, and no fps on an image run (where it would play no part)."""
    r.at_least("model.num_frames", m.num_frames, 1)
    if not (math.isfinite(m.fps) and m.fps > 0):
        r.error("model.fps", "must be a positive, finite frame rate", m.fps, "use e.g. 16 or 24")
    elif m.num_frames == 1 and m.fps != DEFAULT_FPS:
        r.error("model.fps", "set for an image run (model.num_frames = 1), where it plays no part", m.fps,
                "remove model.fps, or set model.num_frames above 1 for video")
    if m.num_frames > 1 and not is_wan_frame_count(m.num_frames):
        r.error("model.num_frames", "the Wan VAE encodes frame 0, then chunks of 4 frames, and silently drops the rest: "
                "a clip has 4k + 1 frames", m.num_frames, f"use {_nearest_valid(m.num_frames)}")


def folder_config_rules(folder: Path, r: Rules) -> None:
    """The named folder's transformer and VAE configs read as bounded JSON and held to the bounds a
    load holds them to (`models.folder_check`), so `validate` and `plan` refuse a hostile or broken
    config before any worker starts; weights are judged when the folder loads."""
    for part, bounds in (("transformer", TRANSFORMER_BOUNDS), ("vae", VAE_BOUNDS)):
        path = folder / part / "config.json"
        if not path.is_file():
            continue  # a folder without the part is refused by name when it loads
        try:
            problem = config_problem(read_config(path, f"{part}/config.json"), bounds, path)
        except FolderProblem as exc:
            problem = exc
        if problem is not None:
            r.error("model.path", str(problem), str(folder), f"repair {part}/config.json, or point model.path at another folder")


def folder_vae_rules(m: schema.ModelConfig, folder: Path, size: tuple[int | None, int | None], r: Rules) -> None:
    """The named folder's VAE against the run's frames and size (only what its config.json says)."""
    path = folder / VAE_CONFIG
    if not path.is_file():
        return
    try:
        config = read_json(path, str(path))
        spatial, temporal = vae_spatial_factor(config), vae_temporal_factor(config)
    except (ValueError, TypeError, KeyError) as exc:
        r.error("model.path", f"vae/config.json is not a Wan VAE config ({exc})", str(folder), "point model.path at a Cosmos3 pipeline folder")
        return
    for key, value in zip(("model.height", "model.width"), size):
        if value is not None and value % spatial:
            r.error(key if m.image_size is None else "model.image_size", f"must be a multiple of the VAE's {spatial}-pixel latent cell ({path})",
                    value, f"use a multiple of {spatial}")
    if m.num_frames == 1:
        return
    declared = config.get("scale_factor_temporal")
    if declared != temporal:
        r.error("model.path", f"vae/config.json declares scale_factor_temporal = {declared}, but its temperal_downsample "
                f"stages compress time {temporal}x; the pipeline would place latent frames at the wrong times", str(folder),
                f"set scale_factor_temporal = {temporal} in {path}")
    if 4 % temporal:
        r.error("model.path", f"the VAE compresses time {temporal}x, which does not divide its 4-frame chunks", str(folder),
                "use a VAE with 1, 2 or 4x temporal compression")

