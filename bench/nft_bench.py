"""NFT rollout benchmark: our packed sampler vs diffusers' Cosmos3OmniPipeline called once per sample.

Both make the same images' worth of work: `--samples` text-to-image samples with the same sampler
steps, shift and native guidance, decoded to pixels, on the built-in tiny model (one process, CPU
unless --device cuda). With `--run-dir`, the step time split of a finished NFT run (median of each
`time/*` metric over its steps, the first step left out as warm-up) is added.

    python bench/nft_bench.py --samples 8 --steps 8 --guidance 1.0 [--run-dir runs/nft_t2i_smoke]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from cosmos_rl.models.build import build_preset, flow_scheduler
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.sampling import sample_latents
from cosmos_rl.models.text import tokenize_prompts
from cosmos_rl.models.vae import decode_latents

PROMPTS = ("a red cube", "a blue sphere", "a green cube", "a yellow sphere")


def _packed(parts, prompts, noise, args) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        cond, uncond = tokenize_prompts(parts.tokenizer, prompts, resolution=(args.size, args.size))
        fn = functools.partial(velocity, parts.transformer)
        x0, _ = sample_latents(fn, noise, cond, uncond, args.steps, args.shift, args.guidance)
        decode_latents(parts.vae, x0)
    return time.perf_counter() - start


def _pipeline(parts, prompts, noise, args) -> float:
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline(
        transformer=parts.transformer, text_tokenizer=parts.tokenizer, vae=parts.vae,
        scheduler=flow_scheduler(args.shift), enable_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    with torch.no_grad():
        for prompt, latent in zip(prompts, noise):
            pipe(
                prompt=prompt, num_frames=1, height=args.size, width=args.size, num_inference_steps=args.steps,
                guidance_scale=args.guidance, latents=latent[None, :, None], output_type="pt",
                enable_safety_check=False,
            )  # fmt: skip
    return time.perf_counter() - start


def _step_split(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = rows[1:] or rows
    keys = ("time/rollout_s", "time/reward_s", "time/train_s", "time/orchestration_s")
    split = {k: statistics.median(r[k] for r in rows) for k in keys}
    split["step_s"] = sum(split.values())
    split["steps"] = len(rows)
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--shift", type=float, default=3.0)
    parser.add_argument("--guidance", type=float, default=1.0)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args()

    device = torch.device(args.device)
    parts = build_preset("tiny", seed=0)
    parts.transformer.to(device)
    parts.vae.to(device)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.samples)]
    side = args.size // int(parts.vae.config.scale_factor_spatial)
    noise = torch.randn(args.samples, parts.transformer.config.latent_channel, side, side,
                        generator=torch.Generator().manual_seed(0)).to(device)  # fmt: skip

    _packed(parts, prompts[:1], noise[:1], args)  # warm-up (first-call allocations, caches)
    packed = min(_packed(parts, prompts, noise, args) for _ in range(args.repeats))
    looped = min(_pipeline(parts, prompts, noise, args) for _ in range(args.repeats))
    result = {
        "device": str(device),
        "samples": args.samples,
        "sampler_steps": args.steps,
        "guidance": args.guidance,
        "image_size": args.size,
        "packed_rollout_s": round(packed, 4),
        "pipeline_per_sample_s": round(looped, 4),
        "packed_samples_per_s": round(args.samples / packed, 2),
        "pipeline_samples_per_s": round(args.samples / looped, 2),
        "speedup": round(looped / packed, 2),
    }
    if args.run_dir is not None:
        result["step_split_median_s"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in _step_split(args.run_dir).items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
