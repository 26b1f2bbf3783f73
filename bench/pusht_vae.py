"""Candidate VAEs for the Push-T base, judged by the Push-T verifier on ground truth through them
(docs/studies/2026-12-07-pusht-vae.md).

A VAE (the `shapes_video` preset's, as `pusht_base_build.initial_parts` starts it, or the same
layout from random weights) trains as an autoencoder on every 9-frame window of a LeRobot Push-T
dataset (`python -m cosmos_rl.pusht dataset DIR --episodes 64 --frames 40 --size S`), with the SFT
VAE stage's loss (`weighted_mse` on `reconstruction`, clamped or not, with the stage's weights:
`--foreground-weight`, and `--classes` / `--miss` as `[rl.pixel_weights]` with suite `pusht`), AdamW and
gradient clipping at 1; every `--every` steps the held-out windows of `--held-out` episodes
(`pusht_base_build.held_out_windows`, the build's gate's episodes) go through it and are scored
(`score_clips`: strict, partial, agent and block pass rates). `--steps 0` scores the start VAE.
One JSON line per evaluation.

    python bench/pusht_vae.py DATASET [--size 32] [--steps 900] [--every 300] [--lr 1e-3]
        [--foreground-weight 10] [--classes agent=30] [--miss 100] [--unclamped] [--init video|random] [--held-out 4] [--png OUT.png]
        [--layout video|frame|fine] [--save OUT.pt] [--load IN.pt]

`--layout frame` is the video VAE without its temporal stage (`temperal_downsample=[False]`, the
image base's layout): every frame its own latent frame (9 latent frames of a 9-frame clip instead of
5), so no latent averages two frames' agent positions; it starts from the video VAE's weights less
the temporal stage's `time_conv`s. `--layout fine` also drops the spatial stage (`dim_mult=[1]`):
patchify 2 only, 16 x 16 latent cells a frame (4x the frame layout's), every frame its own latent
frame; it starts from the video VAE's weights of the same names (every one of its own; the
dropped stage's are left out). `--save` writes the VAE's state dict after the last step,
`--load` starts from one (then `--steps 0` rescores it; `--start-step` numbers the continued steps
on from the saved run's, the optimizer restarting).

Before `--classes` / `--miss` (the trainer's `[rl.pixel_weights]`), the bench had `--agent-weight W`
(the truth's blue-dominant pixels grown by one pixel weighing W: not the verifier's palette rule)
and `--miss-weight W` (as `--miss`); the study's runs up to commit 6a4697c used those.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch


def loss_weights(decoded, clip, foreground_weight: float, classes: dict[str, float], miss: float):
    """The SFT VAE stage's weights (`rl.foreground_weight`, `[rl.pixel_weights]` with suite `pusht`):
    the trainer's own functions, so a recipe found here is the build's."""
    from cosmos_rl.algorithms.sft import class_weights, foreground_weights
    from cosmos_rl.suites.pusht import PUSHT, pixel_classes
    from cosmos_rl.trainers.sft import clip_classes

    weights = foreground_weights(clip, foreground_weight)
    if not classes and miss == 1.0:
        return weights
    ids = {PUSHT.pixel_class_names.index(name) + 1: w for name, w in classes.items()}
    return class_weights(weights, clip_classes(pixel_classes, clip), clip_classes(pixel_classes, decoded), ids, miss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--every", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--foreground-weight", type=float, default=10.0)
    parser.add_argument("--classes", default="", help="[rl.pixel_weights] classes as NAME=W,...: e.g. agent=30 (Push-T's classes: agent, block)")
    parser.add_argument("--miss", type=float, default=1.0, help="[rl.pixel_weights] miss: weight of pixels the verifier classes wrongly; 1 = off")
    parser.add_argument("--unclamped", action="store_true", help="the loss on the decoder's output before its clamp")
    parser.add_argument("--init", choices=("video", "random"), default="video")
    parser.add_argument("--held-out", type=int, default=4, help="held-out episodes (5 windows each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", choices=("video", "frame", "fine"), default="video")
    parser.add_argument("--save", default="", help="write the VAE's state dict here after the last step")
    parser.add_argument("--load", default="", help="start from this state dict (a --save of the same layout)")
    parser.add_argument("--start-step", type=int, default=0, help="the loaded VAE's steps (reporting only)")
    parser.add_argument("--png", default="", help="write truth over reconstruction of the first held-out window")
    args = parser.parse_args()
    torch.set_num_threads(1)
    classes = {name: float(w) for name, w in (item.split("=") for item in args.classes.split(",") if item)}

    from diffusers import AutoencoderKLWan

    from cosmos_rl.algorithms.sft import psnr_db, reconstruction_loss, weighted_mse
    from cosmos_rl.commands import pusht_base_build as pb
    from cosmos_rl.data.lerobot import open_dataset
    from cosmos_rl.models.architectures import PUSHT_VAE, SHAPES_VIDEO_VAE
    from cosmos_rl.models.vae import reconstruction

    torch.manual_seed(args.seed)
    config = copy.deepcopy(SHAPES_VIDEO_VAE)
    if args.layout == "frame":
        config.update(temperal_downsample=[False], scale_factor_temporal=1)
    elif args.layout == "fine":
        config = copy.deepcopy(PUSHT_VAE)  # the pusht preset's VAE: no temporal stage, one spatial stage
    vae = AutoencoderKLWan(**config)
    if args.init == "video":
        start = pb.initial_parts(args.seed).vae.state_dict()
        if args.layout == "fine":  # its modules are a subset of the video VAE's, by name and shape
            assert all(k in start and start[k].shape == v.shape for k, v in vae.state_dict().items())
            start = {k: start[k] for k in vae.state_dict()}
        missing, unexpected = vae.load_state_dict(start, strict=args.layout != "frame")
        # Only the temporal stage's convolutions may differ (the frame layout has none).
        assert not missing and all("time_conv" in k for k in unexpected), (missing, unexpected)
    if args.load:
        vae.load_state_dict(torch.load(args.load, weights_only=True))
    folder = open_dataset(args.dataset)
    episodes = [folder.episode(i).frames for i in folder.meta.episodes]
    windows = [(e, s) for e, frames in enumerate(episodes) for s in range(len(frames) - pb.FRAMES + 1)]
    clips, states, kinds = pb.held_out_windows(args.held_out, args.size)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=args.lr)
    # A continued run draws a fresh window order (the first run's order from --seed alone, as before).
    rng = np.random.default_rng([args.seed, args.start_step] if args.start_step else args.seed)
    started, psnr = time.perf_counter(), None

    def evaluate(step: int) -> None:
        vae.eval()
        out = pb.vae_round_trip(vae, clips)
        print(json.dumps({"step": args.start_step + step, "train_psnr": psnr, **pb.score_clips(out, states, kinds),
                          "elapsed_s": round(time.perf_counter() - started)}), flush=True)
        if args.png:
            import cv2

            rows = np.concatenate([np.concatenate(list(clips[0]), 1), np.concatenate(list(out[0]), 1)], 0)
            cv2.imwrite(args.png, cv2.resize(rows[..., ::-1], None, fx=4, fy=4, interpolation=cv2.INTER_NEAREST))
        vae.train()

    if args.steps == 0:
        evaluate(0)
    vae.train()
    for step in range(1, args.steps + 1):
        picked = rng.choice(len(windows), args.batch, replace=False)
        batch = np.stack([episodes[windows[i][0]][windows[i][1]:windows[i][1] + pb.FRAMES] for i in picked])
        x = torch.from_numpy(batch).permute(0, 4, 1, 2, 3).float() / 255.0
        decoded, clip = reconstruction(vae, x, clamped=not args.unclamped)
        loss = weighted_mse(decoded, clip, loss_weights(decoded, clip, args.foreground_weight, classes, args.miss))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0:
            psnr = round(psnr_db(float(reconstruction_loss(decoded.detach().clamp(-1, 1), clip))), 2)
            evaluate(step)
        if args.save and (step % args.every == 0 or step == args.steps):
            torch.save(vae.state_dict(), args.save)  # each evaluation's weights too, so a stopped run keeps its last
    if args.save and args.steps == 0:
        torch.save(vae.state_dict(), args.save)


if __name__ == "__main__":
    main()
