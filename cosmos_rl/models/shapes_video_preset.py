"""The `shapes_video` preset: the moving-shapes world's base, SFT-trained from the `shapes` base.

Its networks are the image base's, started from its weights, with the VAE's downsampling stage
made temporal, so it halves time (`models.architectures.SHAPES_VIDEO_TRANSFORMER`,
`SHAPES_VIDEO_VAE`). The float16 weights and `manifest.json` live in
`cosmos_rl/models/presets/shapes_video/`, written by `python -m cosmos_rl.commands.video_base_build
build` and checked against the manifest's sha256 on every load, as the `shapes` base is.

`model.preset = "shapes_video"` (docs/video.md, "The video base": what it scores and how it was built).
"""

from __future__ import annotations

import copy
from pathlib import Path

from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

from cosmos_rl.models.architectures import SHAPES_VIDEO_TRANSFORMER, SHAPES_VIDEO_VAE
from cosmos_rl.models.build import ModelParts, flow_scheduler
from cosmos_rl.models.tokenizer import build_tiny_tokenizer
from cosmos_rl.models.shapes_preset import load_shapes_base

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "models" / "presets" / "shapes_video"
REBUILD = "python -m cosmos_rl.commands.video_base_build build"


def shapes_video_architecture(seed: int) -> ModelParts:
    """The video base's networks with random weights from `seed` (CPU, float32, eval mode)."""
    import torch

    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(**copy.deepcopy(SHAPES_VIDEO_VAE))
        transformer = Cosmos3OmniTransformer(**copy.deepcopy(SHAPES_VIDEO_TRANSFORMER), vocab_size=len(tokenizer))
    transformer.eval()
    vae.eval()
    return ModelParts(transformer, vae, tokenizer, flow_scheduler(), prompt_template="minimal")


def build_shapes_video(with_extra_heads: bool) -> ModelParts:
    """The `shapes_video` entry of `models.build.PRESETS`: the shipped video base (no extra heads)."""
    if with_extra_heads:
        raise ValueError("the shapes_video preset has no sound or action heads")
    return load_shapes_base(WEIGHTS_DIR, shapes_video_architecture, REBUILD)
