"""DPO trainer overhead and memory: `python bench/dpo_bench.py [--steps N] [--pairs P]` prints JSON.

For LoRA and full fine-tuning, each in its own process (so peak RSS is that mode's alone):
  trainer_pairs_per_s  DPOTrainer.train_step (data, VAE, noise, two packed forwards, AdamW, metrics)
  bare_pairs_per_s     the same forwards/backward/step on pre-encoded latents, nothing else
  overhead_ratio       bare / trainer (1.0 = the loop adds nothing)
  trainer_split_s      where a trainer step's time goes, per step (mean over the timed steps):
                       data (fetching the pairs' images), vae_encode (the VAE encoding every
                       pair's images), tokenize (prompt ids), noise (drawing eps and t),
                       forwards_and_loss (the reference and policy packed forwards and the loss),
                       rest (backward, gradient norm/clip, AdamW, LR schedule, metrics); measured
                       by wrapping those calls on the trainer instance, so the trainer runs unchanged
  overhead_s_per_step  trainer step - bare step, and `vae_encode_share_of_overhead`
  peak_rss_mib         the process's peak resident memory (resource.getrusage)
Single process, CPU, the tiny preset; one warm-up step of each, then trainer and bare steps
alternate (so load on a shared machine falls on both alike).
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def _timing(spent: dict, key: str, fn):
    """`fn`, adding its seconds to spent[key] on every call."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - start

    return wrapped


def measure(mode: str, steps: int, pairs: int) -> dict:
    import torch

    from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse
    from cosmos_rl.config import load
    from cosmos_rl.flow import noisy_latents, velocity_target
    from cosmos_rl.models.packing import velocity
    from cosmos_rl.trainers.dpo import DPOTrainer

    out_dir = tempfile.mkdtemp()
    config = load.structure(
        {
            "job": {"output_dir": out_dir, "progress": False},
            "model": {"lora": {"rank": 8 if mode == "lora" else 0}},
            "checkpoint": {"every": 0},
            "rl": {"algorithm": "dpo", "max_steps": steps + 1, "pairs_per_step": pairs, "data": {"synthetic_pairs": 64}},
        }
    )
    trainer = DPOTrainer(config, Path(out_dir) / "run", torch.device("cpu"))
    batch = [trainer.train_source[i] for i in range(pairs)]
    latents, ids = trainer._pair_tensors(batch)
    eps = torch.randn((pairs, *latents.shape[1:]))
    t = torch.rand(pairs)
    eps2, t2 = torch.cat([eps, eps]), torch.cat([t, t])
    x_t, target = noisy_latents(latents, eps2, t2), velocity_target(latents, eps2)
    policy, opt = trainer.policy, trainer.optimizer

    def bare_step():
        with torch.no_grad(), policy.reference() as ref:
            mse_ref = per_sample_mse(velocity(ref, x_t, t2, ids), target)
        mse = per_sample_mse(velocity(policy.transformer, x_t, t2, ids), target)
        loss, _ = dpo_loss(mse[:pairs], mse[pairs:], mse_ref[:pairs], mse_ref[pairs:], 1000.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    trainer.train_step()  # warm-ups
    bare_step()
    spent: dict = defaultdict(float)
    # Instance attributes shadow the methods for this trainer only; vae.encode is what encode_images calls.
    trainer.next_pairs = _timing(spent, "data", trainer.next_pairs)
    trainer.prompt_ids = _timing(spent, "tokenize", trainer.prompt_ids)
    trainer.policy.vae.encode = _timing(spent, "vae_encode", trainer.policy.vae.encode)
    trainer._draw = _timing(spent, "noise", trainer._draw)
    trainer._objective = _timing(spent, "forwards_and_loss", trainer._objective)
    trainer_s = bare_s = 0.0
    for _ in range(steps):  # alternated, so load on a shared machine falls on both alike
        began = time.perf_counter()
        trainer.train_step()
        trainer_s += time.perf_counter() - began
        began = time.perf_counter()
        bare_step()
        bare_s += time.perf_counter() - began
    trainer_rate, bare_rate = steps * pairs / trainer_s, steps * pairs / bare_s
    split = {k: spent[k] / steps for k in ("data", "vae_encode", "tokenize", "noise", "forwards_and_loss")}
    split["rest"] = trainer_s / steps - sum(split.values())
    overhead = (trainer_s - bare_s) / steps
    return {
        "mode": mode,
        "pairs_per_step": pairs,
        "trainer_pairs_per_s": round(trainer_rate, 2),
        "bare_pairs_per_s": round(bare_rate, 2),
        "overhead_ratio": round(bare_rate / trainer_rate, 3),
        "trainer_step_s": round(trainer_s / steps, 4),
        "bare_step_s": round(bare_s / steps, 4),
        "trainer_split_s": {k: round(v, 4) for k, v in split.items()},
        "overhead_s_per_step": round(overhead, 4),
        "vae_encode_share_of_overhead": round(split["vae_encode"] / overhead, 3) if overhead > 0 else None,
        "trainable_params": sum(p.numel() for p in trainer.params),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--one", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.steps, args.pairs)))
        return
    results = []
    for mode in ("lora", "full"):
        proc = subprocess.run(
            [sys.executable, __file__, "--one", mode, "--steps", str(args.steps), "--pairs", str(args.pairs)],
            capture_output=True, text=True, check=True,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps({"bench": "dpo", "results": results}, indent=1))


if __name__ == "__main__":
    main()
