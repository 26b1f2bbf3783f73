"""Candidate VAEs for the Push-T base, judged by the Push-T verifier on ground truth through them
(docs/studies/2026-12-07-pusht-vae.md).

A VAE (the `shapes_video` preset's, as `pusht_base_build.initial_parts` starts it, or the same
layout from random weights) trains as an autoencoder on every 9-frame window of a LeRobot Push-T
dataset (`python -m cosmos_rl.pusht dataset DIR --episodes 64 --frames 40 --size S`), with the SFT
VAE stage's loss (`weighted_reconstruction_loss` on `reconstruction`, clamped or not), AdamW and
gradient clipping at 1; every `--every` steps the held-out windows of `--held-out` episodes
(`pusht_base_build.held_out_windows`, the build's gate's episodes) go through it and are scored
(`score_clips`: strict, partial, agent and block pass rates). `--steps 0` scores the start VAE.
One JSON line per evaluation.

    python bench/pusht_vae.py DATASET [--size 32] [--steps 900] [--every 300] [--lr 1e-3]
        [--foreground-weight 10] [--unclamped] [--init video|random] [--held-out 4] [--png OUT.png]
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
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch


def agent_weights(clip, foreground_weight: float, agent_weight: float):
    """The foreground weights with the agent's pixels weighted `agent_weight` instead: the disc is
    ~4 of 1,024 pixels at 32 x 32, so the foreground weight alone leaves it to the T's blur. The agent
    is the only blue-dominant part of the drawing (RoyalBlue rim, its light fill); the mask grows by one
    pixel so the loss also reaches where a moving disc's edge falls."""
    from cosmos_rl.algorithms.sft import foreground_weights

    rgb = (clip.float() + 1.0) * 127.5  # [-1, 1] -> [0, 255]
    blue = (rgb[:, 2] - torch.maximum(rgb[:, 0], rgb[:, 1]) > 20.0)[:, None].float()
    agent = torch.nn.functional.max_pool3d(blue, (1, 3, 3), stride=1, padding=(0, 1, 1)) > 0
    return torch.where(agent, agent_weight, foreground_weights(clip, foreground_weight))


def verdict_misses(decoded, clip):
    """bool [B, 1, F, H, W]: the pixels the verifier classes differently in the decoded frame than in
    the truth (agent / block / neither, by `pusht.verifier.colour_masks` on the uint8 frames). These
    are the pixels that move the agent's centroid or the block's IoU: a faint blue tint on the T
    next to the disc is an agent pixel to the verifier however small its squared error."""
    from cosmos_rl.pusht.verifier import colour_masks

    def classes(x):
        frames = ((x.detach().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy()
        out = np.zeros(frames.shape[:-1], dtype=np.int8)
        for b in range(frames.shape[0]):
            for f in range(frames.shape[1]):
                agent, block = colour_masks(frames[b, f])
                out[b, f] = agent + 2 * block
        return out

    return torch.from_numpy(classes(decoded) != classes(clip))[:, None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--every", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--foreground-weight", type=float, default=10.0)
    parser.add_argument("--agent-weight", type=float, default=0.0,
                        help="weight of the agent's pixels (blue-dominant, grown by 1 px) in the loss; 0: the foreground weight's")
    parser.add_argument("--miss-weight", type=float, default=0.0,
                        help="weight of the pixels the verifier classes differently from the truth (agent/block/neither); 0: off")
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

    from diffusers import AutoencoderKLWan

    from cosmos_rl.algorithms.sft import foreground_weights, psnr_db, reconstruction_loss, weighted_mse, weighted_reconstruction_loss
    from cosmos_rl.commands import pusht_base_build as pb
    from cosmos_rl.data.lerobot import open_dataset
    from cosmos_rl.models.architectures import SHAPES_VIDEO_VAE
    from cosmos_rl.models.vae import reconstruction

    torch.manual_seed(args.seed)
    config = copy.deepcopy(SHAPES_VIDEO_VAE)
    if args.layout == "frame":
        config.update(temperal_downsample=[False], scale_factor_temporal=1)
    elif args.layout == "fine":
        config.update(dim_mult=[1], temperal_downsample=[], scale_factor_spatial=2, scale_factor_temporal=1)
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
        if args.agent_weight or args.miss_weight:
            weights = (agent_weights(clip, args.foreground_weight, args.agent_weight) if args.agent_weight
                       else foreground_weights(clip, args.foreground_weight))
            if args.miss_weight:
                weights = torch.where(verdict_misses(decoded, clip), torch.maximum(weights, torch.tensor(args.miss_weight)), weights)
            loss = weighted_mse(decoded, clip, weights)
        else:
            loss = weighted_reconstruction_loss(decoded, clip, args.foreground_weight)
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
