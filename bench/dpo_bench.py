"""DPO trainer overhead and memory: `python bench/dpo_bench.py [--steps N] [--pairs P]` prints JSON.

For LoRA and full fine-tuning, each in its own process (so peak RSS is that mode's alone):
  trainer_pairs_per_s  DPOTrainer.train_step (data, VAE, noise, two packed forwards, AdamW, metrics)
  bare_pairs_per_s     the same forwards/backward/step on the same pairs, pre-encoded, nothing else;
                       it switches to the reference as the trainer does (`model.reference()`)
  overhead_ratio       bare / trainer (1.0 = the loop adds nothing); `cpu_overhead_ratio` the same
                       in CPU seconds (time.process_time), which load on a shared machine moves less;
                       `cpu_overhead_ratio_median` the median over steps of each trainer step's CPU
                       seconds over those of the bare step right after it (one slow step moves it less)
  trainer_split_s      where a trainer step's time goes, per step (mean over the timed steps), wall
                       and CPU: data (fetching the pairs' images), vae_encode (the VAE encoding every
                       pair's images), tokenize (prompt ids), noise (drawing eps and t),
                       forwards_and_loss (the reference and policy packed forwards and the loss),
                       rest (backward, gradient norm/clip, AdamW, LR schedule, metrics); measured
                       by wrapping those calls on the trainer instance, so the trainer runs unchanged
  bare_split_s         the bare step's forwards_and_loss and rest (backward, AdamW)
  overhead_s_per_step  trainer step - bare step, and `vae_encode_share_of_overhead`
  peak_rss_mib         the process's peak resident memory (resource.getrusage)
  switch_cpu_ms        LoRA only: CPU milliseconds of one switch to the reference and back, after
                       the timed steps, 100 of each alternated: `project` is `model.reference()`
                       (what both loops above use), `diffusers` the model-level calls
                       `disable_adapters()`/`enable_adapters()` a loop written on diffusers' public
                       API would make (the project's path before it switched the layers itself)
Single process, CPU, the tiny preset, `--threads` torch threads (default 1: CPU seconds then count
work, not idle spinning). One warm-up step of each; then every trainer step is followed by a bare
step on the very pairs it drew (their VAE encoding not timed), so both see the same prompt
lengths and the same load.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PHASES = ("data", "vae_encode", "tokenize", "noise", "forwards_and_loss")


class Stopwatch:
    """Wall and CPU seconds per key, accumulated while `on` is set."""

    def __init__(self):
        self.wall: dict = defaultdict(float)
        self.cpu: dict = defaultdict(float)
        self.on = False

    def wrap(self, key: str, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.on:
                    self.wall[key] += time.perf_counter() - wall
                    self.cpu[key] += time.process_time() - cpu

        return wrapped

    def run(self, key: str, fn):
        self.on = True
        try:
            return self.wrap(key, fn)()
        finally:
            self.on = False


def _split(watch: Stopwatch, keys, total: str, steps: int, clock: str) -> dict:
    spent = getattr(watch, clock)
    split = {k: spent[k] / steps for k in keys}
    split["rest"] = spent[total] / steps - sum(split.values())
    return {k: round(v, 4) for k, v in split.items()}


def measure(mode: str, steps: int, pairs: int, threads: int, data_pairs: int = 64) -> dict:
    import torch

    from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse
    from cosmos_rl.config import load
    from cosmos_rl.core.flow import noisy_latents, velocity_target
    from cosmos_rl.models.packing import velocity
    from cosmos_rl.trainers.dpo import DPOTrainer

    torch.set_num_threads(threads)
    out_dir = tempfile.mkdtemp()
    config = load.structure(
        {
            "job": {"output_dir": out_dir, "progress": False},
            "model": {"preset": "tiny", "lora": {"rank": 8 if mode == "lora" else 0}},
            "checkpoint": {"every": 0},
            "rl": {"algorithm": "dpo", "max_steps": steps + 1, "pairs_per_step": pairs, "data": {"synthetic_pairs": data_pairs}},
        }
    )
    trainer = DPOTrainer(config, Path(out_dir) / "run", torch.device("cpu"))
    policy, opt = trainer.model, trainer.optimizer
    trainer_watch, bare_watch = Stopwatch(), Stopwatch()

    def bare_step(latents, ids):
        eps = torch.randn((pairs, *latents.shape[1:]))
        t = torch.rand(pairs)
        eps2, t2 = torch.cat([eps, eps]), torch.cat([t, t])
        x_t, target = noisy_latents(latents, eps2, t2), velocity_target(latents, eps2)

        def forwards_and_loss():
            with torch.no_grad(), policy.reference() as ref:
                mse_ref = per_sample_mse(velocity(ref, x_t, t2, ids), target)
            mse = per_sample_mse(velocity(policy.transformer, x_t, t2, ids), target)
            return dpo_loss(mse[:pairs], mse[pairs:], mse_ref[:pairs], mse_ref[pairs:], 1000.0)[0]

        loss = bare_watch.wrap("forwards_and_loss", forwards_and_loss)()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    drawn: list = []
    fetch = trainer.next_pairs

    def next_pairs():
        drawn.append(fetch())
        return drawn[-1]

    # Instance attributes shadow the methods for this trainer only; vae.encode is what encode_images calls.
    trainer.next_pairs = trainer_watch.wrap("data", next_pairs)
    trainer.prompt_ids = trainer_watch.wrap("tokenize", trainer.prompt_ids)
    trainer.model.vae.encode = trainer_watch.wrap("vae_encode", trainer.model.vae.encode)
    trainer._draw = trainer_watch.wrap("noise", trainer._draw)
    trainer._objective = trainer_watch.wrap("forwards_and_loss", trainer._objective)

    trainer.train_step(trainer.step + 1)  # warm-ups
    bare_step(*trainer._pair_tensors(drawn[-1]))
    paired = []  # each step's trainer CPU seconds over its bare step's
    for _ in range(steps):
        before = trainer_watch.cpu["step"]
        trainer_watch.run("step", lambda: trainer.train_step(trainer.step + 1))
        latents, ids = trainer._pair_tensors(drawn[-1])  # untimed: the watch is off
        trainer_cpu_step, before = trainer_watch.cpu["step"] - before, bare_watch.cpu["step"]
        bare_watch.run("step", functools.partial(bare_step, latents, ids))
        paired.append(trainer_cpu_step / (bare_watch.cpu["step"] - before))

    switch = _switch_cpu_ms(trainer.model) if mode == "lora" else None

    def per_step(watch, clock):
        return getattr(watch, clock)["step"] / steps

    trainer_s, bare_s = per_step(trainer_watch, "wall"), per_step(bare_watch, "wall")
    trainer_cpu, bare_cpu = per_step(trainer_watch, "cpu"), per_step(bare_watch, "cpu")
    split = _split(trainer_watch, PHASES, "step", steps, "wall")
    overhead = trainer_s - bare_s
    return {
        "mode": mode,
        "pairs_per_step": pairs,
        "threads": threads,
        "trainer_pairs_per_s": round(pairs / trainer_s, 2),
        "bare_pairs_per_s": round(pairs / bare_s, 2),
        "overhead_ratio": round(trainer_s / bare_s, 3),
        "cpu_overhead_ratio": round(trainer_cpu / bare_cpu, 3),
        "cpu_overhead_ratio_median": round(statistics.median(paired), 3),
        "trainer_step_s": round(trainer_s, 4),
        "bare_step_s": round(bare_s, 4),
        "trainer_split_s": split,
        "trainer_split_cpu_s": _split(trainer_watch, PHASES, "step", steps, "cpu"),
        "bare_split_s": _split(bare_watch, ("forwards_and_loss",), "step", steps, "wall"),
        "bare_split_cpu_s": _split(bare_watch, ("forwards_and_loss",), "step", steps, "cpu"),
        "overhead_s_per_step": round(overhead, 4),
        "vae_encode_share_of_overhead": round(split["vae_encode"] / overhead, 3) if overhead > 0 else None,
        "trainable_params": sum(p.numel() for p in trainer.params),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "switch_cpu_ms": switch,
    }


def _switch_cpu_ms(model, repeats: int = 100) -> dict:
    """CPU ms of one reference switch (in and out) by the project's path and by diffusers' calls, alternated."""
    transformer = model.transformer

    def project():
        with model.reference():
            pass

    def diffusers():
        transformer.disable_adapters()
        transformer.enable_adapters()

    spent = {"project": 0.0, "diffusers": 0.0}
    for _ in range(repeats):
        for name, switch in (("project", project), ("diffusers", diffusers)):
            cpu = time.process_time()
            switch()
            spent[name] += time.process_time() - cpu
    return {name: round(total / repeats * 1e3, 3) for name, total in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--data-pairs", type=int, default=64,
                        help="synthetic pairs in the data; fewer than steps x pairs repeats epochs, which the latent cache serves")
    parser.add_argument("--one", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.steps, args.pairs, args.threads, args.data_pairs)))
        return
    results = []
    for mode in ("lora", "full"):
        proc = subprocess.run(
            [sys.executable, __file__, "--one", mode, "--steps", str(args.steps), "--pairs", str(args.pairs),
             "--threads", str(args.threads), "--data-pairs", str(args.data_pairs)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps({"bench": "dpo", "results": results}, indent=1))


if __name__ == "__main__":
    main()
