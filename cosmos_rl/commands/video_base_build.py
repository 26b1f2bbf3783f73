"""Build the `shapes_video` preset with the project's own SFT: `python -m cosmos_rl.commands.video_base_build build`.

Deterministic from `--seed` (given the same torch build and thread count). Stages, each resumable
as `shapes.base_build`'s are (each SFT stage is a run directory under `--work` with a checkpoint
every `--checkpoint-every` steps; running the command again continues every unfinished stage,
and larger `--vae-steps` / `--steps` extend finished ones):

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
import json
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from cosmos_rl.commands.base_build import _train_stage, build_parser, run_main, stage_config

SPLIT_SEED = 0
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


def clip_latent_stats(vae, source, count: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the encoder's posterior means over the first `count` clips."""
    import torch

    chunks = []
    with torch.no_grad():
        for start in range(0, min(count, len(source)), 64):
            clips = torch.stack([source[i].image for i in range(start, min(start + 64, count, len(source)))])
            chunks.append(vae.encode(clips * 2 - 1).latent_dist.mode())
    latents = torch.cat(chunks).transpose(0, 1).reshape(vae.config.z_dim, -1)
    return latents.mean(dim=1).tolist(), latents.std(dim=1).tolist()


def _shards(args) -> list[str]:
    from cosmos_rl.data.clip_shards import ClipRecord, write_clip_shards
    from cosmos_rl.shapes.clips import render_clip
    from cosmos_rl.shapes.motion_world import balanced_motion, split_motion_prompts
    from cosmos_rl.shapes.shards import sample_seed

    shard_dir = args.work / "shards"
    if not any(shard_dir.glob("motion-*.tar")):
        specs = balanced_motion(split_motion_prompts(SPLIT_SEED).train, args.samples, args.seed)
        records = (ClipRecord(render_clip(spec, sample_seed(args.seed, i), SIDE, FRAMES), spec.caption(), {"task": spec.task})
                   for i, spec in enumerate(specs))  # fmt: skip
        write_clip_shards(shard_dir, records, FPS, 1000, prefix="motion")
    return [str(p.resolve()) for p in sorted(shard_dir.glob("motion-*.tar"))]


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


def build(args) -> dict:
    import torch

    from cosmos_rl.models.build import save_parts
    from cosmos_rl.models.shapes_preset import load_shapes_base, set_latent_stats, write_weights
    from cosmos_rl.models.shapes_video_preset import shapes_video_architecture

    torch.set_num_threads(args.threads)
    work = args.work
    shards = _shards(args)
    init = work / "init"
    if not (init / "transformer").is_dir():
        save_parts(initial_parts(args.seed), init)

    vae_trainer = _train_stage(_stage_config(args, "vae", "vae", init, shards))
    parts = vae_trainer.parts
    set_latent_stats(parts.vae, *clip_latent_stats(parts.vae.eval(), vae_trainer.source, LATENT_STAT_CLIPS))
    save_parts(parts, work / "vae_model")

    flow_trainer = _train_stage(_stage_config(args, "transformer", "transformer", work / "vae_model", shards))
    parts = flow_trainer.parts
    parts.transformer.eval()
    runs = work / "runs"
    info = {
        "preset": "shapes_video",
        "command": shlex.join(["python", "-m", "cosmos_rl.commands.video_base_build", *sys.argv[1:]]),
        "recipe": {k: v for k, v in vars(args).items() if k not in ("work", "out", "command")},
        "media": {"frames": FRAMES, "size": SIDE, "fps": FPS},
        "split_seed": SPLIT_SEED,
        "wall_clock_s": {s: round(json.loads((runs / s / "wall_clock_s.json").read_text())["seconds"]) for s in ("vae", "transformer")},
        "torch": torch.__version__,
    }
    manifest = write_weights(parts, args.out, info)
    if args.eval_seeds > 0:
        from cosmos_rl.commands.video_held_out import held_out_video_scores

        shipped = load_shapes_base(Path(args.out), shapes_video_architecture)  # the float16 files, as shipped
        manifest["held_out"] = held_out_video_scores(shipped, seeds=args.eval_seeds)
        (Path(args.out) / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_main(_parser(), build, argv, preset="shapes_video")


if __name__ == "__main__":
    sys.exit(main())
