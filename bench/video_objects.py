"""What a video model of the moving-shapes world draws, frame by frame: the diagnosis behind a task
that stays at 0.

For every held-out prompt x seed (the same items, noise and sampler as `cosmos-rl eval TARGET
--per-task N --seeds S`), the clip is judged three ways, per task:

  - the video verifier, strict and partial (what `cosmos-rl eval` reports);
  - frame by frame, the image verifier against the caption's static part ("a red circle moving
    left and a square staying still" -> "a red circle and a square"; colour changes have none and
    are left out): the share of frames that draw exactly the caption's objects, the share of clips
    where every frame does, and the share per frame index;
  - the ground-truth clips of the same items through the model's VAE (encode, decode): what the
    latent space can hold at best.

A run directory is judged at its checkpoint and at its base (the adapters off), as eval does.

    python bench/video_objects.py [TARGET] [--per-task 0] [--seeds 2] [--step N] [--sample-steps N] [--guidance G]

TARGET defaults to preset:shapes_video. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _by_task(captions: list[str], values) -> dict[str, float]:
    """{task: mean} of `values`, one per caption (the verifier's own grouping), to 4 digits."""
    from cosmos_rl.shapes.motion_verifier import motion_scores_by_task

    return {task: round(float(v), 4) for task, v in motion_scores_by_task(captions, [float(x) for x in values]).items()}


def judge(clips: np.ndarray, captions: list[str]) -> dict:
    """The video verdicts and the per-frame image verdicts of uint8 clips [N, F, H, W, 3]."""
    from cosmos_rl.shapes.motion_verifier import frame_captions, verify_clips
    from cosmos_rl.shapes.verifier import verify

    verdicts = verify_clips(clips, captions)
    strict = np.array([v.strict for v in verdicts], dtype=float)
    partial = np.array([v.partial for v in verdicts], dtype=float)
    out = {
        "video_strict": _by_task(captions, strict),
        "video_partial": _by_task(captions, partial),
    }
    still = frame_captions(captions)
    rows = [i for i, caption in enumerate(still) if caption is not None]
    n, frames = len(rows), clips.shape[1]
    flat = clips[rows].reshape(n * frames, *clips.shape[2:])
    per_frame = np.array([v.strict for v in verify(flat, [still[i] for i in rows for _ in range(frames)])]).reshape(n, frames)
    kept = [captions[i] for i in rows]
    out["frames_right"] = _by_task(kept, per_frame.mean(axis=1))
    out["clips_all_frames_right"] = _by_task(kept, per_frame.min(axis=1))
    out["frames_right_by_index"] = [round(float(v), 4) for v in per_frame.mean(axis=0)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", nargs="?", default="preset:shapes_video")
    parser.add_argument("--per-task", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--sample-steps", type=int, default=None)
    parser.add_argument("--guidance", type=float, default=None)
    args = parser.parse_args()

    import torch

    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.evaluation.prompts import held_out_captions
    from cosmos_rl.suites import registry as suites
    from cosmos_rl.evaluation.target import open_target, target_media
    from cosmos_rl.data.pixels import to_unit_float
    from cosmos_rl.models.generate import decode_pixels, encode_pixels
    from cosmos_rl.core.media import latent_shape
    from cosmos_rl.shapes.clips import render_clip

    started = time.perf_counter()
    target = open_target(args.target, step=args.step, media=target_media(args.target, None, None))
    if not target.media.is_video:
        raise SystemExit(f"{args.target} makes images; this bench judges clips")
    cpu = torch.device("cpu")
    model = target.load(cpu)
    settings = target.settings.replaced(args.sample_steps, args.guidance)
    captions = held_out_captions(suites.get("shapes_video"), args.per_task)
    evaluator = Evaluator(
        captions, args.seeds, "shapes_video_strict", settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae,
        media=target.media, latent_shape=latent_shape(target.media, model.parts.vae.config, model.parts.transformer.config),
        device=cpu, model_parts=model.model_parts,
    )  # fmt: skip
    items = evaluator.items
    item_captions = [item.caption for item in items]
    result = {
        "target": args.target, "step": target.step, "sampler": settings.resolved(model.model_parts).as_json(),
        "n_prompts": len(captions), "seeds": args.seeds, "frames": target.media.frames, "size": target.media.height,
    }  # fmt: skip
    models = [("model", model.policy)] + ([("base", model.base)] if model.base is not None else [])
    for label, network_of in models:
        with network_of() as network:
            result[label] = judge(evaluator.sample(network, items), item_captions)
    truth = np.stack([render_clip(item.caption, item.seed, target.media.height, target.media.frames) for item in items])
    vae = model.parts.vae.eval()
    decoded = []
    with torch.no_grad():
        for start in range(0, len(truth), 64):
            clips = torch.from_numpy(to_unit_float(truth[start : start + 64])).permute(0, 4, 1, 2, 3)  # [B, 3, F, H, W]
            decoded.append(decode_pixels(vae, target.media, encode_pixels(vae, target.media, clips)).numpy())
    result["vae_round_trip"] = judge(np.concatenate(decoded), item_captions)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
