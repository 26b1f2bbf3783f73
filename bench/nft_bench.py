"""NFT rollout benchmark: our packed sampler vs diffusers' Cosmos3OmniPipeline called once per sample.

Both make the same images' worth of work: `--samples` text-to-image samples with the same sampler
steps, shift and native guidance, decoded to pixels, on the built-in tiny model (one process, CPU
unless --device cuda). The pipeline runs with diffusers' own attention processor (packing.velocity
installs its packed one on the model, so it is put back first). The two are timed alternately,
best of `--repeats` each, so load on a shared machine drifts over both alike. `--threads` torch
threads (default 1: CPU seconds then count work, not idle spinning); `cpu_speedup` is the same
ratio in CPU seconds, which load moves less than wall seconds.

With `--run-dir`, the step time split of a finished NFT run (median of each `time/*` metric over
its steps, the first step left out as warm-up) is added.

With `--memory`, the peak memory of an NFT step with the policy, old and reference (adapters
disabled) versus a policy-only model: each in a fresh process on CPU (peak RSS only grows within a
process), the "small" bench model (bench/cosmos3_steps.py), a one-rank FSDP2 world, a rollout and
`--memory-steps` NFT train steps. `delta_mib` is the peak above the process's RSS before the model
was built (what the model, adapters, optimizer and activations added); `ratio` divides the deltas
(goal <= 1.10), `ratio_of_peaks` the whole peaks (libraries included).

`text_tower_reuse` (always): the packed rollout and an NFT train step (old, reference and policy
forwards, backward, AdamW) with text-tower reuse (models/text_kv.py) and without it, side by side:
the tiny preset with LoRA policy and old adapters on `model.lora.target_modules = ["generation"]`,
`SIZES["tiny"]`'s work (CFG rollout of 4 samples, 4 rows x 2 timesteps), alternated, best of
`--repeats`, at each `--reuse-sizes` image size: 32 px is the CPU preset (text tokens outnumber
vision tokens); the larger size gives the text tower about the fifth of a step's tokens it has in
the public 512 px manifests. `rollout_speedup` = rollout time without / with reuse. `--reuse-model
small` runs it on the wider 4-layer transformer (bench/cosmos3_steps.py), whose layers, not the VAE
and per-forward overhead, take most of a step.

    python bench/nft_bench.py --samples 8 --steps 8 --guidance 1.0 [--run-dir runs/nft_t2i_smoke] [--memory]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cosmos3_steps import stock_attention

from cosmos_rl.models.build import build_preset, flow_scheduler
from cosmos_rl.core.media import MediaSpec, latent_shape
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.sampling import sample_latents
from cosmos_rl.models.text import tokenize_prompts
from cosmos_rl.models.vae import decode_latents

PROMPTS = ("a red cube", "a blue sphere", "a green cube", "a yellow sphere")


def _packed(parts, prompts, noise, args) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        cond, uncond = tokenize_prompts(parts.tokenizer, prompts, resolution=(args.size, args.size))
        fn = functools.partial(velocity, parts.transformer)
        x0, _ = sample_latents(fn, noise, cond, uncond, args.steps, args.shift, args.guidance)
        decode_latents(parts.vae, x0)
    return time.perf_counter() - start, time.process_time() - cpu


def _pipeline(parts, prompts, noise, args) -> tuple[float, float]:
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline(
        transformer=parts.transformer, text_tokenizer=parts.tokenizer, vae=parts.vae,
        scheduler=flow_scheduler(args.shift), enable_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    stock_attention(parts.transformer)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for prompt, latent in zip(prompts, noise):
            pipe(
                prompt=prompt, num_frames=1, height=args.size, width=args.size, num_inference_steps=args.steps,
                guidance_scale=args.guidance, latents=latent[None], output_type="pt",
                enable_safety_check=False,
            )  # fmt: skip
    return time.perf_counter() - start, time.process_time() - cpu


def _step_split(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = rows[1:] or rows
    keys = ("time/rollout_s", "time/reward_s", "time/train_s", "time/orchestration_s")
    split = {k: statistics.median(r[k] for r in rows) for k in keys}
    split["step_s"] = sum(split.values())
    split["steps"] = len(rows)
    return split


MEMORY_VARIANTS = ("policy_only", "policy_old_ref")


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _memory_one(variant: str, train_steps: int) -> dict:
    """One process: build the small model with `variant`'s adapters, roll out, train; peak RSS."""
    import cosmos3_steps as steps
    from cosmos_rl.dist import world
    from cosmos_rl.dist.fsdp import quiet_view_output_warning

    quiet_view_output_warning()
    device = torch.device("cpu")
    world.init_process_group(device, 0, 1, 600.0, store_file=os.path.join(tempfile.mkdtemp(), "store"))
    full = variant == "policy_old_ref"
    spec = steps.SIZES["small"]
    before = _rss_mib()
    parts = steps.build_parts("small", device)
    adapters = (steps.POLICY, steps.OLD) if full else (steps.POLICY,)
    policy, optimizer = steps.make_policy(parts, device, spec, adapters, mixed_precision=False)
    prompts, cond, uncond = steps.prompt_ids(parts, spec.rollout_samples, spec.image, device)
    noise = steps.rollout_noise(parts, spec.rollout_samples, spec.image, device)
    batch = steps.make_batch(parts, spec.nft_rows * spec.timesteps_per_sample, spec.image, device, seed=1)
    for _ in range(train_steps):
        steps.activate(policy.transformer, steps.OLD if full else steps.POLICY)
        steps.packed_rollout(parts, policy.transformer, spec, noise, cond, uncond)
        steps.activate(policy.transformer, steps.POLICY)
        steps.nft_step(policy, optimizer, batch, with_old=full, kl_beta=1.0 if full else 0.0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    torch.distributed.destroy_process_group()
    return {
        "variant": variant, "adapters": list(adapters), "reference_forward": full,
        "params": sum(p.numel() for p in policy.transformer.parameters()),
        "trainable_params": sum(p.numel() for p in policy.trainable_parameters()),
        "rss_before_build_mib": round(before, 1), "peak_rss_mib": round(peak, 1), "delta_mib": round(peak - before, 1),
    }  # fmt: skip


def _memory_compare(train_steps: int) -> dict:
    runs = {}
    for variant in MEMORY_VARIANTS:
        proc = subprocess.run(
            [sys.executable, __file__, "--memory-one", variant, "--memory-steps", str(train_steps), "--threads", "1"],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        runs[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    only, full = runs["policy_only"], runs["policy_old_ref"]
    return {
        "model": "small (bench/cosmos3_steps.py)", "device": "cpu", "train_steps": train_steps, **runs,
        "ratio": round(full["delta_mib"] / only["delta_mib"], 3),
        "ratio_of_peaks": round(full["peak_rss_mib"] / only["peak_rss_mib"], 3), "goal_ratio": 1.10,
    }  # fmt: skip


def _reuse_one(size: int, repeats: int, model: str = "tiny") -> dict:
    """Rollout and NFT train step with and without text-tower reuse at `size` px on the `model` bench size (see the docstring)."""
    import dataclasses

    import cosmos3_steps as steps
    from cosmos_rl.models import text_kv

    device = torch.device("cpu")
    spec = dataclasses.replace(steps.SIZES[model], image=size)
    parts = steps.build_parts(model, device)
    policy, optimizer = steps.make_policy(
        parts, device, spec, (steps.POLICY, steps.OLD), mixed_precision=False, targets=["generation"]
    )
    transformer = policy.transformer
    prompts, cond, uncond = steps.prompt_ids(parts, spec.rollout_samples, spec.image, device)
    noise = steps.rollout_noise(parts, spec.rollout_samples, spec.image, device)
    # Training rows use the rollout's prompts (a sample trains on its own prompt), as in a real step.
    batch = steps.make_batch(parts, spec.nft_rows * spec.timesteps_per_sample, spec.image, device, seed=1)
    batch.ids = [cond[i % len(cond)] for i in range(len(batch.ids))]

    def one_step() -> tuple[float, float, float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        steps.activate(transformer, steps.OLD)
        steps.packed_rollout(parts, transformer, spec, noise, cond, uncond)
        steps.activate(transformer, steps.POLICY)
        rollout, rollout_cpu = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        steps.nft_step(policy, optimizer, batch, with_old=True, kl_beta=1.0)
        return rollout, rollout_cpu, time.perf_counter() - wall, time.process_time() - cpu

    def without() -> tuple[float, float, float, float]:
        with text_kv.disabled(transformer):
            return one_step()

    one_step(), without()  # warm-up
    cache = text_kv.cache_of(transformer)
    before = dict(cache.counts)
    on, off = [], []
    for _ in range(repeats):
        on.append(one_step())
        off.append(without())
    best_on, best_off = [min(column) for column in zip(*on)], [min(column) for column in zip(*off)]
    text = sum(int(ids.numel()) for ids in cond + uncond) / (2 * len(cond))
    vision = steps.vision_tokens(parts, spec.image)
    names = ("rollout_s", "rollout_cpu_s", "train_step_s", "train_step_cpu_s")
    return {
        "model": model, "image_size": size, "text_tokens_per_forward_sample": round(text, 1), "vision_tokens_per_sample": vision,
        "text_fraction_of_tokens": round(text / (text + vision), 3),
        "with_reuse": {k: round(v, 4) for k, v in zip(names, best_on)},
        "without_reuse": {k: round(v, 4) for k, v in zip(names, best_off)},
        "rollout_speedup": round(best_off[0] / best_on[0], 2),
        "rollout_cpu_speedup": round(best_off[1] / best_on[1], 2),
        "train_step_speedup": round(best_off[2] / best_on[2], 2),
        "train_step_cpu_speedup": round(best_off[3] / best_on[3], 2),
        # per step with reuse: one recording forward (the rollout's first), every other forward reuses
        "forwards_per_step_with_reuse": {k: (cache.counts[k] - before[k]) // repeats for k in cache.counts},
    }  # fmt: skip


def text_tower_reuse(sizes: list[int], repeats: int, model: str = "tiny") -> dict:
    return {
        "target_modules": ["generation"], "sampler_steps": 4, "guidance": 3.0, "rollout_samples": 4,
        "train_rows": "4 rows x 2 timesteps (old, reference and policy forwards)",
        "sizes": [_reuse_one(size, repeats, model) for size in sizes], "goal_rollout_speedup_at_public_ratio": 1.2,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--shift", type=float, default=3.0)
    parser.add_argument("--guidance", type=float, default=1.0)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--memory", action="store_true", help="add the policy+old+reference vs policy-only memory figure")
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--memory-one", choices=MEMORY_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--reuse-sizes", default="32,192", help="image sizes (px) of the text-tower reuse comparison")
    parser.add_argument("--only-reuse", action="store_true", help="print only the text-tower reuse comparison")
    parser.add_argument("--reuse-model", choices=["tiny", "small"], default="tiny",
                        help="bench model of the text-tower reuse comparison: the tiny preset, or its wider 4-layer transformer (bench/cosmos3_steps.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_one:
        print(json.dumps(_memory_one(args.memory_one, args.memory_steps)))
        return

    reuse = text_tower_reuse([int(v) for v in args.reuse_sizes.split(",")], args.repeats, args.reuse_model)
    if args.only_reuse:
        print(json.dumps({"text_tower_reuse": reuse, "threads": args.threads}, indent=1))
        return
    device = torch.device(args.device)
    parts = build_preset("tiny", seed=0)
    parts.transformer.to(device)
    parts.vae.to(device)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.samples)]
    shape = latent_shape(MediaSpec.image(args.size), parts.vae.config, parts.transformer.config)
    noise = torch.randn(args.samples, *shape, generator=torch.Generator().manual_seed(0)).to(device)

    _packed(parts, prompts[:1], noise[:1], args)  # warm-up (first-call allocations, caches)
    _pipeline(parts, prompts[:1], noise[:1], args)
    packed_times, looped_times = [], []
    for _ in range(args.repeats):
        packed_times.append(_packed(parts, prompts, noise, args))
        looped_times.append(_pipeline(parts, prompts, noise, args))
    packed, packed_cpu = (min(column) for column in zip(*packed_times))
    looped, looped_cpu = (min(column) for column in zip(*looped_times))
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
        "packed_rollout_cpu_s": round(packed_cpu, 4),
        "pipeline_cpu_s": round(looped_cpu, 4),
        "cpu_speedup": round(looped_cpu / packed_cpu, 2),
        "threads": args.threads,
    }
    if args.run_dir is not None:
        result["step_split_median_s"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in _step_split(args.run_dir).items()}
    result["text_tower_reuse"] = reuse
    if args.memory:
        result["memory"] = _memory_compare(args.memory_steps)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
