"""Build the `shapes_video` preset with the project's own SFT: `python -m cosmos_rl.commands.video_base_build build`.

Deterministic from `--seed` (given the same torch build and thread count). The image base's
stages, run by the same code (`base_build.build_base`) and resumable as they are (each SFT stage
is a run directory under `--work` with a checkpoint every `--checkpoint-every` steps; running the
command again continues every unfinished stage, and larger `--vae-steps` / `--steps` extend
finished ones):

1. shards: `--samples` task-balanced training prompts of the moving-shapes world
   (`split_motion_prompts(0)`: its held-out prompts stay unseen) rendered as 9-frame 32x32 clips in
   mp4 shards;
2. `init/`: the video architecture with random weights from the seed, then every weight of the
   shipped `shapes` base: all of its transformer, and all of its VAE but the temporal stage's
   `time_conv`s, which the image VAE does not have and which keep their random start;
3. `runs/vae`: SFT with `rl.train = "vae"` on the clips (foreground-weighted, `--vae-foreground-weight`), then the per-channel latent statistics of
   the trained encoder over the first 1024 clips -> `vae_model/`;
4. `runs/transformer`: SFT with `rl.train = "transformer"` on `vae_model/`, half the clips trained
   image-to-video (`[model.condition]` first frame from the clip, probability 0.5), so the base does T2V and I2V;
5. the result as float16 safetensors + `manifest.json` in `--out` (default: the package's
   `cosmos_rl/models/presets/shapes_video/`), then its held-out scores (`score` stage: the shipped
   float16 weights through `cosmos-rl eval`'s evaluator, T2V and I2V), written into the manifest.

Each stage prints its wall-clock; `manifest.json` records them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from cosmos_rl.commands.base_build import SPLIT_SEED, build_base, build_parser, latent_stats, run_main, stage_config

FRAMES, SIDE, FPS = 9, 32, 24.0
LATENT_STAT_CLIPS = 1024


# Foreground weight 10: with plain MSE a VAE started from random weights settled on the black
# background and never drew the shapes (foreground PSNR near 5.5 dB); weighted, it escaped by step
# ~400. The image-initialised VAE starts out drawing them; the weight stays for the moving frames.
VIDEO_RECIPE = dict(work="shapes_video_work", samples=12000, vae_steps=2000, vae_batch=8, vae_foreground_weight=10.0,
                    steps=7000, batch=32, eval_seeds=4)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    from cosmos_rl.models.shapes_video_preset import WEIGHTS_DIR

    parser, _ = build_parser("python -m cosmos_rl.commands.video_base_build", __doc__, WEIGHTS_DIR, VIDEO_RECIPE,
                             unit="clips", what="the video base")  # fmt: skip
    return parser


def _stage_config(args, name: str, train: str, model_path: Path, shards: list[str]):
    """One stage's SFT config: the image build's, on 9-frame clips, half of them trained image to video."""
    return stage_config(args, name, train, model_path, shards, label="shapes_video",
                        model={"image_size": SIDE, "num_frames": FRAMES}, condition={"kind": "first_frame", "source": "data", "probability": 0.5})  # fmt: skip


def _clip_means(vae, clips):
    """The encoder's posterior means of [B, 3, F, H, W] clips in [0, 1]."""
    return vae.encode(clips * 2 - 1).latent_dist.mode()


def initial_parts(seed: int):
    """The video architecture with random weights from `seed`, then every weight of the shipped
    `shapes` base: all of its transformer and all of its VAE but the temporal stage's `time_conv`s."""
    from cosmos_rl.models.shapes_preset import load_shapes_base
    from cosmos_rl.models.shapes_video_preset import shapes_video_architecture

    parts = shapes_video_architecture(seed)
    image = load_shapes_base()
    parts.transformer.load_state_dict(image.transformer.state_dict(), strict=True)
    ours, theirs = parts.vae.state_dict(), image.vae.state_dict()
    new = sorted(set(ours) - set(theirs))
    assert new and all(".time_conv." in k for k in new) and set(theirs) <= set(ours), new  # the one temporal stage
    parts.vae.load_state_dict(theirs, strict=False)
    return parts


def _held_out(args) -> dict:
    """The shipped float16 weights' held-out scores through `cosmos-rl eval`'s evaluator, T2V and I2V."""
    from cosmos_rl.commands.video_held_out import held_out_video_scores
    from cosmos_rl.models.shapes_preset import load_shapes_base
    from cosmos_rl.models.shapes_video_preset import shapes_video_architecture

    shipped = load_shapes_base(Path(args.out), shapes_video_architecture)  # the float16 files, as shipped
    return held_out_video_scores(shipped, seeds=args.eval_seeds)


def build(args) -> dict:
    from cosmos_rl.shapes.motion_shards import write_motion_shards
    from cosmos_rl.shapes.motion_world import balanced_motion, split_motion_prompts

    def shards(folder: Path) -> None:
        specs = balanced_motion(split_motion_prompts(SPLIT_SEED).train, args.samples, args.seed)
        write_motion_shards(folder, specs, args.seed, SIDE, FRAMES, FPS)

    return build_base(
        args, preset="shapes_video", module="cosmos_rl.commands.video_base_build", prefix="motion", write_shards=shards,
        initial_parts=initial_parts, stage=_stage_config, held_out=_held_out,
        stats=lambda vae, source: latent_stats(vae, source, LATENT_STAT_CLIPS, chunk=64, encode=_clip_means),
        media={"frames": FRAMES, "size": SIDE, "fps": FPS},
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_main(_parser(), build, argv, preset="shapes_video")


if __name__ == "__main__":
    sys.exit(main())
