"""GPU check: NFT rollout samples/s (packed vs the stock pipeline), NFT, DPO and GRPO step time, peak
memory and MFU of a Nano-like Cosmos3 under bf16 FSDP2 with LoRA policy + old adapters, for images and
for clips. One JSON object.

    python3 bench/gpu_check.py                                   # one GPU, Nano-like random weights
    python3 bench/gpu_check.py --model /models/cosmos3-nano      # that folder's architecture (random weights)
    python3 bench/gpu_check.py --size tiny --device cpu          # the test suite's run (seconds)
    python3 bench/gpu_check.py --phases video --gradient-checkpointing   # the clips alone (docs/results.md)

A one-rank FSDP2 world (nccl on the GPU, gloo on CPU, through a file store: no socket). Phases, in
order, each skipped (and said so) once `--budget-s` is spent, so a run always ends in time:
  nft_policy_only  a model with the "policy" adapter only: the NFT train step without the old and
                   reference forwards (what the memory ratio divides by)
  rollout          "policy" + "old" adapters: the old policy samples `rollout_samples` images
                   packed (one forward per sampler step) and through Cosmos3OmniPipeline per sample
  nft              the NFT train step: old and reference no-grad forwards, policy forward+backward,
                   AdamW, old-adapter blend (kl_beta > 0 so the reference forward is paid for)
  dpo              the DPO step on `dpo_pairs` pairs: reference no-grad forward and policy
                   forward+backward of all 2P samples, AdamW
  generation_targets  a fresh model with "policy" + "old" on `model.lora.target_modules =
                   ["generation"]` (the public Cosmos3 RL recipe's): the packed rollout and the NFT
                   train step each with text-tower reuse (models/text_kv.py) and without, alternated,
                   and the adapter's size against the default (both towers) targets
  video            text to video at the size's clip shape (cosmos3_steps.VIDEO_SIZES; nano: 832x480,
                   17 frames at 16 fps, one rank's share of manifests/nft_t2v_public_8gpu.toml, LoRA
                   on the generation tower), on a fresh model with "policy" + "old":
                   rollout  the packed rollout of `rollout_samples` clips against Cosmos3OmniPipeline
                            per clip, same noise; the clips' largest pixel difference
                   profile  torch.profiler over one packed forward of a rollout sampler step: time per
                            op family, kernel launches (CUDA) or aten ops (CPU), per decoder layer too;
                            `--trace FILE` also writes its Chrome trace
                   nft      the NFT train step on rows x timesteps clips (old and policy forwards: no KL,
                            as the manifest)
                   grpo     the GRPO train step after an SDE rollout (Flow-GRPO-Fast: a 2-step window,
                            a reference and a policy forward per trained step, KL 0.04)
                   Its FLOPs count the forwards as they ran: one that reused the text tower's
                   keys/values (models/text_kv.py) counts its vision rows only, so the stock pipeline,
                   which never reuses, is charged more FLOPs for the same clips.
`--phases` runs a subset in the same order (e.g. `--phases generation_targets` alone, the first thing
to measure in a short GPU slot; `--phases video` the video phase alone); a phase left out says so.
Every phase says which targets it adapts (`targets`), how many parameters train, and whether the
text tower's keys/values were reused (`text_tower_reuse`: the default targets adapt the text tower,
so reuse is off there). At nano a model takes about 61 GB of float32 master weights and, while a
rollout keeps the layers gathered, 31 GB more of bf16 copies: a GPU of about 100 GB or more (an
H200), not an 80 GB H100.
Timings are medians over `--iters` after one warm-up (rollouts: best of `--repeats`). Memory is
torch.cuda.max_memory_allocated per phase on a GPU, the process's peak RSS on CPU (which never
goes down, so the CPU ratio is left out; `bench/nft_bench.py --memory` measures it in fresh
processes). MFU counts model FLOPs (bench/mfu.py) against the device's dense bf16 peak; null on CPU,
where the run uses one torch thread. `dtypes`: what the first forward received and computed in, and
the dtypes of the reduced gradients, AdamW moments and master weights after the first phase.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import cosmos3_steps as steps
import mfu


class Clock:
    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.perf_counter(), budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def spent(self) -> bool:
        return self.elapsed() > self.budget_s


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Flops:
    """Model FLOPs of this run's forwards, from the transformer's configuration.

    One adapter's LoRA matmuls are counted on every forward, the reference's too (adapters off
    there), which overstates a reference forward by about 1 % at rank 32 on the Nano-like model;
    they are counted on all seven linears of a token's pathway even where the targets adapt fewer
    (the video phase's generation-tower attention): at most about 1 % more again.
    """

    def __init__(self, config, lora_rank: int, vision_tokens: int):
        self.layers = int(config.num_hidden_layers)
        self.width = int(config.num_attention_heads) * int(config.head_dim)
        self.vision = vision_tokens
        self.params = mfu.cosmos3_params_per_token(
            hidden=int(config.hidden_size), intermediate=int(config.intermediate_size),
            heads=int(config.num_attention_heads), kv_heads=int(config.num_key_value_heads),
            head_dim=int(config.head_dim), layers=self.layers, lora_rank=lora_rank,
        )  # fmt: skip

    def forward(self, text_lens: list[int]) -> int:
        vision = [self.vision] * len(text_lens)
        return mfu.forward_flops(
            params_per_token=self.params, tokens=sum(text_lens) + sum(vision), layers=self.layers,
            attn_width=self.width, attention_pairs=mfu.cosmos3_attention_pairs(text_lens, vision),
        )  # fmt: skip

    def of(self, forwards, *, as_stock: bool = False) -> int:
        """FLOPs of recorded packed forwards (`cosmos3_steps.Forward`) as they ran: a forward with a
        graph counts 3x, one that reused the text tower's keys/values counts its vision rows only.
        `as_stock`: the same samples through the stock pipeline, which never reuses (no-grad forwards)."""
        total = 0
        for f in forwards:
            reused = f.text_reused and not as_stock
            tokens = sum(f.vision_lens) + (0 if reused else sum(f.text_lens))
            pairs = mfu.cosmos3_attention_pairs(list(f.text_lens), list(f.vision_lens), text_reused=reused)
            one = mfu.forward_flops(
                params_per_token=self.params, tokens=tokens, layers=self.layers, attn_width=self.width, attention_pairs=pairs
            )
            total += one * (3 if f.grad and not as_stock else 1)
        return total


class DtypeWatch:
    """What the transformer's forwards receive (the pipeline's integer timesteps and float32 mRoPE
    positions: never the compute dtype) and compute in (a decoder layer's gathered weights: bf16
    under mixed precision), and, at `report`, what training keeps (reduced gradients, AdamW moments,
    master weights: float32). docs/scale.md, "Precision", says what is cast where."""

    def __init__(self, transformer: torch.nn.Module):
        self.seen: dict[str, str] = {}
        self.hooks = [
            transformer.register_forward_pre_hook(self._root, with_kwargs=True),
            transformer.layers[0].register_forward_pre_hook(self._layer),
        ]

    def _root(self, module, args, kwargs) -> None:
        self.seen.setdefault("timesteps", str(kwargs["vision_timesteps"].dtype))
        self.seen.setdefault("positions", str(kwargs["position_ids"].dtype))

    def _layer(self, module, args) -> None:
        self.seen.setdefault("layer_weights", str(next(module.parameters()).dtype))

    def report(self, params: list, optimizer) -> dict:
        for hook in self.hooks:
            hook.remove()
        local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731  (a DTensor's shard)
        moments = [local(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq") if k in s]
        return {
            **self.seen,
            "reduced_grads": sorted({str(local(p.grad).dtype) for p in params if p.grad is not None}),
            "optimizer_state": sorted({str(m.dtype) for m in moments}),
            "master_weights": sorted({str(p.dtype) for p in params}),
        }


def towers_columns(policy) -> dict:
    """Which targets the policy adapts, its trainable size, and whether its forwards reused the text tower."""
    from cosmos_rl.models import text_kv

    counts = text_kv.cache_of(policy.transformer).counts
    return {
        "targets": getattr(policy, "bench_targets", "default (both towers)"),
        "trainable_params": sum(p.numel() for p in policy.trainable_parameters()),
        "text_tower_reuse": counts["reuse"] > 0,
    }


def step_phase(clock, device, iters, run_step, flops: Flops, text_lens, peak_tflops) -> dict:
    if clock.spent():
        return {"skipped": f"time budget spent after {clock.elapsed():.0f} s"}
    counts = run_step()  # warm-up: allocator, kernels, optimizer state
    reset_peak(device)
    times = [steps.timed(run_step, device) for _ in range(iters)]
    step_s = statistics.median(times)
    total = mfu.step_flops(flops.forward(text_lens), **counts)
    return {
        "samples": len(text_lens), "step_s": round(step_s, 4), "iters": iters, **counts,
        "flops": total, "tflops_per_s": round(total / step_s / 1e12, 3),
        "mfu": _round(mfu.mfu(total, step_s, peak_tflops)), "peak_memory_mib": peak_mib(device),
    }  # fmt: skip


def _round(value, digits: int = 4):
    return None if value is None else round(value, digits)


def rollout_phase(parts, policy, spec, device, clock, repeats, flops: Flops, peak_tflops) -> dict:
    if clock.spent():
        return {"skipped": f"time budget spent after {clock.elapsed():.0f} s"}
    transformer, samples = policy.transformer, spec.rollout_samples
    prompts, cond, uncond = steps.prompt_ids(parts, samples, spec.image, device)
    noise = steps.rollout_noise(parts, samples, spec.image, device)
    steps.activate(transformer, steps.OLD)  # the trainer samples with the old policy
    reset_peak(device)

    def packed():
        steps.packed_rollout(parts, transformer, spec, noise, cond, uncond)

    def pipeline():
        steps.pipeline_rollout(parts, transformer, spec, noise, prompts)

    steps.packed_rollout(parts, transformer, spec, noise[:1], cond[:1], uncond[:1])  # warm-up
    packed_s = min(steps.timed(packed, device) for _ in range(repeats))
    packed_peak = peak_mib(device)
    steps.pipeline_rollout(parts, transformer, spec, noise[:1], prompts[:1])  # warm-up
    pipeline_s = min(steps.timed(pipeline, device) for _ in range(repeats))
    steps.activate(transformer, steps.POLICY)

    lens = [int(i.numel()) for i in cond] + ([int(i.numel()) for i in uncond] if spec.guidance != 1.0 else [])
    total = spec.sample_steps * flops.forward(lens)  # both make the same forwards; decoding not counted
    return {
        "samples": samples, "sampler_steps": spec.sample_steps, "guidance": spec.guidance, "repeats": repeats,
        "packed_s": round(packed_s, 4), "pipeline_s": round(pipeline_s, 4),
        "packed_samples_per_s": round(samples / packed_s, 3), "pipeline_samples_per_s": round(samples / pipeline_s, 3),
        "speedup": round(pipeline_s / packed_s, 3), "transformer_flops": total,
        "packed_mfu": _round(mfu.mfu(total, packed_s, peak_tflops)),
        "pipeline_mfu": _round(mfu.mfu(total, pipeline_s, peak_tflops)),
        "packed_peak_memory_mib": packed_peak,
    }  # fmt: skip


def _best_alternating(on, off, device, repeats: int) -> tuple[float, float]:
    times_on, times_off = [], []
    for _ in range(repeats):
        times_on.append(steps.timed(on, device))
        times_off.append(steps.timed(off, device))
    return min(times_on), min(times_off)


def generation_targets_phase(args, spec, device, clock, default_trainable: int | None) -> dict:
    """Text-tower reuse on and off, side by side, with adapters on the generation tower only."""
    from cosmos_rl.models import text_kv

    if clock.spent():
        return {"skipped": f"time budget spent after {clock.elapsed():.0f} s"}
    parts, policy, optimizer = build(args, spec, device, (steps.POLICY, steps.OLD), targets=["generation"])
    transformer, samples = policy.transformer, spec.rollout_samples
    prompts, cond, uncond = steps.prompt_ids(parts, samples, spec.image, device)
    noise = steps.rollout_noise(parts, samples, spec.image, device)
    nft = steps.make_batch(parts, spec.nft_rows * spec.timesteps_per_sample, spec.image, device, seed=1)
    nft.ids = [cond[i % len(cond)] for i in range(len(nft.ids))]  # a sample trains on its own prompt

    def rollout():
        steps.activate(transformer, steps.OLD)
        steps.packed_rollout(parts, transformer, spec, noise, cond, uncond)
        steps.activate(transformer, steps.POLICY)

    def rollout_off():
        with text_kv.disabled(transformer):
            rollout()

    def nft_step():  # after the step's rollout, as in the trainer (its prompts' entries are held)
        rollout()
        started = time.perf_counter()
        steps.sync(device)
        steps.nft_step(policy, optimizer, nft, with_old=True, kl_beta=1.0)
        steps.sync(device)
        train_times.append(time.perf_counter() - started)

    def nft_step_off():
        with text_kv.disabled(transformer):
            nft_step()

    rollout(), rollout_off()  # warm-up
    reset_peak(device)
    on_s, off_s = _best_alternating(rollout, rollout_off, device, args.repeats)
    peak = peak_mib(device)
    result = {
        "targets": ["generation"], "rollout_samples": samples,
        "trainable_params": sum(p.numel() for p in policy.trainable_parameters()),
        "default_targets_trainable_params": default_trainable,
        "rollout_with_reuse_s": round(on_s, 4), "rollout_without_reuse_s": round(off_s, 4),
        "rollout_reuse_speedup": round(off_s / on_s, 3), "rollout_peak_memory_mib": peak,
    }  # fmt: skip
    if not clock.spent():
        train_times: list[float] = []
        nft_step(), nft_step_off()  # warm-up (optimizer state)
        train_on, train_off = [], []
        for _ in range(args.iters):
            train_times.clear()
            nft_step()
            train_on.append(train_times[-1])
            train_times.clear()
            nft_step_off()
            train_off.append(train_times[-1])
        result.update(
            nft_train_with_reuse_s=round(statistics.median(train_on), 4),
            nft_train_without_reuse_s=round(statistics.median(train_off), 4),
            nft_train_reuse_speedup=round(statistics.median(train_off) / statistics.median(train_on), 3),
        )
    else:
        result["nft"] = {"skipped": f"time budget spent after {clock.elapsed():.0f} s"}
    result["text_tower_reuse"] = text_kv.cache_of(transformer).counts["reuse"] > 0
    del parts, policy, optimizer
    release(device)
    return result


# -------------------------------------------------------------------------------------------- video
# Op families of the profile, by the name of the op whose self time (CPU) or kernels (CUDA) they
# are. A needle with "::" is an op's exact name (an in-place variant's trailing "_" dropped: aten::add_
# is aten::add); one without matches anywhere in the name. The first family that matches wins.
OP_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl", "c10d", "gloo", "all_gather", "allgather", "reduce_scatter", "all_reduce", "allreduce",
                       "broadcast", "record_param_comms")),
    ("attention", ("scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "flex_attention", "softmax")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm",
                "aten::mv", "aten::addmv")),
    ("norm", ("norm",)),
    ("cast_copy", ("aten::copy", "aten::to", "aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize",
                   "aten::clone", "aten::contiguous", "aten::cat", "aten::stack", "aten::index", "aten::index_select",
                   "aten::index_put", "aten::_index_put_impl", "aten::gather", "aten::scatter", "aten::repeat",
                   "aten::repeat_interleave", "aten::pad", "aten::constant_pad_nd")),
    ("elementwise", ("aten::add", "aten::sub", "aten::rsub", "aten::mul", "aten::div", "aten::silu", "aten::gelu",
                     "aten::exp", "aten::log", "aten::pow", "aten::sqrt", "aten::rsqrt", "aten::reciprocal", "aten::neg",
                     "aten::abs", "aten::sign", "aten::sin", "aten::cos", "aten::tanh", "aten::sigmoid", "aten::where",
                     "aten::clamp", "aten::clamp_min", "aten::maximum", "aten::minimum", "aten::mean", "aten::sum",
                     "aten::max", "aten::min", "aten::fill", "aten::zero", "aten::addcmul", "aten::addcdiv", "aten::lerp",
                     "aten::square", "aten::eq", "aten::ne", "aten::gt", "aten::lt", "aten::ge", "aten::le", "_foreach")),
)  # fmt: skip
# "other": an aten op of no family above (views, allocation, ...); "framework": the self time of a
# range that is not an aten op (FSDP's hooks, the per-layer ranges below): Python between ops.
FAMILY_NAMES = tuple(name for name, _ in OP_FAMILIES) + ("other", "framework")
_STEP_RANGE, _LAYER_RANGE = "gpu_check::profiled_step", "gpu_check::decoder_layer"


def op_family(name: str) -> str:
    """The family of an op by its name.

    >>> op_family("aten::addmm"), op_family("aten::_flash_attention_forward"), op_family("aten::add_")
    ('matmul', 'attention', 'elementwise')
    >>> op_family("aten::expand"), op_family("aten::_fused_rms_norm"), op_family("FSDP::pre_forward")
    ('other', 'norm', 'framework')
    """
    lowered = name.lower()
    base = lowered[:-1] if lowered.endswith("_") and not lowered.endswith("__") else lowered
    for family, needles in OP_FAMILIES:
        if any((needle == base) if "::" in needle else (needle in lowered) for needle in needles):
            return family
    return "other" if lowered.startswith("aten::") else "framework"


def _family_of_event(event) -> str:
    # A CUDA runtime call (cudaLaunchKernel ...) that owns kernels belongs to the op that made it.
    while event.name.startswith("cu") and event.cpu_parent is not None:
        event = event.cpu_parent
    return op_family(event.name)


def _subtree(event):
    yield event
    for child in event.cpu_children:
        yield from _subtree(child)


def _layer_ranges(layers):
    """Forward hooks that put every decoder layer's forward in a profiler range of its own."""
    from torch.autograd.profiler import record_function

    open_ranges: list = []

    def enter(module, args):
        open_ranges.append(record_function(_LAYER_RANGE))
        open_ranges[-1].__enter__()

    def leave(module, args, output):
        open_ranges.pop().__exit__(None, None, None)

    return [h for layer in layers for h in (layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave))]


def profile_call(fn, device: torch.device, layers, trace: Path | None) -> dict:
    """torch.profiler over one call of `fn`: its wall time, time per op family (self CPU time on CPU,
    kernel time on CUDA: both only of ops inside the call, so the families sum to at most the
    wall time), kernel launches (CUDA) or aten ops dispatched, nested ones included (CPU), and the
    same count per decoder layer forward (median over the layers)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    hooks = _layer_ranges(layers)
    try:
        steps.sync(device)
        with profile(activities=activities) as prof, record_function(_STEP_RANGE):
            fn()
            steps.sync(device)  # every kernel ends inside the range: kernel time <= the range's
    finally:
        for hook in hooks:
            hook.remove()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    events = [e for e in prof.events() if e.device_type == DeviceType.CPU and not e.is_async]
    step = next(e for e in events if e.name == _STEP_RANGE)
    inside = list(_subtree(step))[1:]
    families = dict.fromkeys(FAMILY_NAMES, 0.0)
    for event in inside:
        # (torch before 2.4 named the device time self_cuda_time_total)
        self_us = getattr(event, "self_device_time_total", None) if cuda else event.self_cpu_time_total
        if self_us is None:
            self_us = event.self_cuda_time_total
        families[_family_of_event(event)] += self_us / 1e6

    def launches(root) -> int:
        nodes = list(_subtree(root))
        if cuda:
            return sum(len(e.kernels) for e in nodes)
        return sum(1 for e in nodes if e.name.startswith("aten::"))

    per_layer = [launches(e) for e in inside if e.name == _LAYER_RANGE]
    total_s = step.cpu_time_total / 1e6
    return {
        "total_s": round(total_s, 6), "time_kind": "cuda_kernel" if cuda else "self_cpu",
        "families_s": {k: round(v, 6) for k, v in families.items()},
        # CPU: Python outside every op and range; CUDA: the time no kernel of the step ran (launch-bound)
        "unattributed_s": round(max(0.0, total_s - sum(families.values())), 6),
        "launch_kind": "cuda_kernels" if cuda else "aten_ops", "launches": launches(step),
        "layer_forwards": len(per_layer), "per_layer_launches": statistics.median(per_layer) if per_layer else None,
        "trace": str(trace) if trace is not None else None,
    }  # fmt: skip


def _skipped(clock) -> dict:
    return {"skipped": f"time budget spent after {clock.elapsed():.0f} s"}


def video_rollout_phase(parts, policy, spec, device, clock, repeats, flops: Flops, peak_tflops) -> dict:
    """Packed T2V rollout against Cosmos3OmniPipeline per clip, same noise; the clips compared."""
    if clock.spent():
        return _skipped(clock)
    transformer, samples = policy.transformer, spec.rollout_samples
    prompts, cond, uncond = steps.video_prompt_ids(parts, samples, spec, device)
    noise = steps.video_noise(parts, samples, spec, device)
    steps.activate(transformer, steps.OLD)  # the trainer samples with the old policy
    out: dict = {}

    def packed():
        out["packed"] = steps.packed_video_rollout(parts, transformer, spec, noise, cond, uncond)

    def pipeline():
        out["pipeline"] = steps.pipeline_video_rollout(parts, transformer, spec, noise, prompts)

    steps.packed_video_rollout(parts, transformer, spec, noise[:1], cond[:1], uncond[:1])  # warm-up
    reset_peak(device)
    runs = []
    for _ in range(repeats):
        with steps.recorded_forwards() as forwards:
            runs.append((steps.timed(packed, device), forwards))
    packed_s, forwards = min(runs, key=lambda run: run[0])
    packed_peak = peak_mib(device)
    steps.pipeline_video_rollout(parts, transformer, spec, noise[:1], prompts[:1])  # warm-up
    reset_peak(device)
    pipeline_s = min(steps.timed(pipeline, device) for _ in range(repeats))
    pipeline_peak = peak_mib(device)
    steps.activate(transformer, steps.POLICY)
    packed_flops, stock_flops = flops.of(forwards), flops.of(forwards, as_stock=True)
    return {
        "samples": samples, "sampler_steps": spec.sample_steps, "guidance": spec.guidance, "repeats": repeats,
        "packed_s": round(packed_s, 4), "pipeline_s": round(pipeline_s, 4),
        "packed_samples_per_s": round(samples / packed_s, 4), "pipeline_samples_per_s": round(samples / pipeline_s, 4),
        "speedup": round(pipeline_s / packed_s, 3),
        "packed_forwards": len(forwards), "packed_text_reused_forwards": sum(f.text_reused for f in forwards),
        "packed_flops": packed_flops, "pipeline_flops": stock_flops,
        "packed_mfu": _round(mfu.mfu(packed_flops, packed_s, peak_tflops)),
        "pipeline_mfu": _round(mfu.mfu(stock_flops, pipeline_s, peak_tflops)),
        "packed_peak_memory_mib": packed_peak, "pipeline_peak_memory_mib": pipeline_peak,
        "clips_shape": list(out["packed"].shape), "pipeline_clips_shape": list(out["pipeline"].shape),
        "max_abs_pixel_diff": float((out["packed"].float() - out["pipeline"].float()).abs().max()),
    }  # fmt: skip


def video_profile_phase(parts, policy, spec, device, clock, trace: Path | None) -> dict:
    """The profile of one rollout sampler step's packed forward (both CFG branches when guidance is
    on), as a rollout runs every step after its first: old adapter, layers gathered, text held."""
    from cosmos_rl.dist.fsdp import gathered_while_sampling
    from cosmos_rl.models import text_kv

    if clock.spent():
        return _skipped(clock)
    transformer, samples = policy.transformer, spec.rollout_samples
    _, cond, uncond = steps.video_prompt_ids(parts, samples, spec, device)
    noise = steps.video_noise(parts, samples, spec, device)
    ids, x = (cond, noise) if spec.guidance == 1.0 else (cond + uncond, torch.cat([noise, noise]))
    sigma = torch.full((x.shape[0],), 0.5, device=device)
    timing = steps.video_timing(parts, spec)
    steps.activate(transformer, steps.OLD)

    def forward():
        steps.counted_velocity(transformer, x, sigma, ids, **timing)

    with torch.no_grad(), gathered_while_sampling(transformer), text_kv.held_while_sampling(transformer):
        forward()  # warm-up; fills the text keys/values the profiled forward reads, as a later sampler step does
        with steps.recorded_forwards() as forwards:
            result = profile_call(forward, device, transformer.layers, trace)
    steps.activate(transformer, steps.POLICY)
    result.update(what="one packed forward of a rollout sampler step", samples=len(ids),
                  text_tower_reuse=forwards[0].text_reused, decoder_layers=len(transformer.layers))
    return result


def video_step_phase(clock, device, iters, run_step, flops: Flops, peak_tflops) -> dict:
    """A train step's median time, its FLOPs from the forwards it ran, MFU and peak memory."""
    if clock.spent():
        return _skipped(clock)
    run_step()  # warm-up: allocator, kernels, optimizer state
    reset_peak(device)
    runs = []
    for _ in range(iters):
        with steps.recorded_forwards() as forwards:
            runs.append((steps.timed(run_step, device), forwards))
    step_s = statistics.median(t for t, _ in runs)
    forwards = runs[0][1]  # every iteration runs the same forwards (each step starts with no text held)
    total = flops.of(forwards)
    return {
        "step_s": round(step_s, 4), "iters": iters, "forwards": len(forwards),
        "grad_forwards": sum(f.grad for f in forwards), "text_reused_forwards": sum(f.text_reused for f in forwards),
        "samples_per_forward": max(len(f.text_lens) for f in forwards),
        "flops": total, "tflops_per_s": round(total / step_s / 1e12, 3),
        "mfu": _round(mfu.mfu(total, step_s, peak_tflops)), "peak_memory_mib": peak_mib(device),
    }  # fmt: skip


def video_phase(args, device, clock, peak_tflops) -> dict:
    """T2V at the size's clip shape (steps.VIDEO_SIZES): the rollout against the pipeline, a profile
    of a rollout step, the NFT and the GRPO train step, on one model with "policy" + "old" adapters
    on the size's targets (nano: the generation tower, as the public T2V manifest)."""
    from cosmos_rl.models import text_kv

    if clock.spent():
        return _skipped(clock)
    spec = steps.VIDEO_SIZES[args.size]
    if args.rollout_samples is not None:
        spec = dataclasses.replace(spec, rollout_samples=args.rollout_samples)
    started = time.perf_counter()
    parts = steps.build_video_parts(args.size, device, folder=args.model, load_weights=args.load_weights)
    if args.gradient_checkpointing:
        parts.transformer.enable_gradient_checkpointing()
    policy, optimizer = steps.make_policy(
        parts, device, spec, (steps.POLICY, steps.OLD), mixed_precision=args.dtype == "bfloat16", targets=list(spec.targets)
    )
    shape = steps.video_latent_shape(parts, spec)
    patch = int(parts.transformer.config.latent_patch_size)
    vision = shape[1] * -(-shape[2] // patch) * -(-shape[3] // patch)
    flops = Flops(parts.transformer.config, spec.lora_rank, vision)
    _, cond, _ = steps.video_prompt_ids(parts, spec.rollout_samples, spec, device)
    result: dict = {
        "media": {"frames": spec.frames, "height": spec.height, "width": spec.width, "fps": spec.fps},
        "latent_shape": list(shape), "vision_tokens_per_clip": vision,
        "text_tokens_mean": round(statistics.mean(int(c.numel()) for c in cond), 1),
        "targets": list(spec.targets), "trainable_params": sum(p.numel() for p in policy.trainable_parameters()),
        "lora_rank": spec.lora_rank, "sample_steps": spec.sample_steps, "shift": spec.shift, "guidance": spec.guidance,
        "build_s": round(time.perf_counter() - started, 2),
    }  # fmt: skip
    result["rollout"] = video_rollout_phase(parts, policy, spec, device, clock, args.repeats, flops, peak_tflops)
    result["profile"] = video_profile_phase(parts, policy, spec, device, clock, args.trace)

    nft = steps.video_batch(parts, spec.nft_rows * spec.timesteps_per_sample, spec, device, seed=1)
    result["nft"] = video_step_phase(
        clock, device, args.iters,
        lambda: steps.nft_step(policy, optimizer, nft, with_old=True, kl_beta=spec.nft_kl_beta), flops, peak_tflops,
    )  # fmt: skip
    if "skipped" not in result["nft"]:
        result["nft"].update(rows=spec.nft_rows, timesteps_per_sample=spec.timesteps_per_sample, kl_beta=spec.nft_kl_beta)

    result["grpo"] = _skipped(clock)
    if not clock.spent():
        prompts_ids = steps.video_prompt_ids(parts, spec.rollout_samples, spec, device)[1:]
        noise = steps.video_noise(parts, spec.rollout_samples, spec, device)
        steps.activate(policy.transformer, steps.POLICY)  # GRPO samples with the policy itself
        sde_started = time.perf_counter()
        records = steps.grpo_rollout(parts, policy.transformer, spec, noise, prompts_ids)
        steps.sync(device)
        sde_s = time.perf_counter() - sde_started
        advantages = torch.tensor([(-1.0) ** i for i in range(spec.rollout_samples)], device=device)
        result["grpo"] = video_step_phase(
            clock, device, args.iters,
            lambda: steps.grpo_step(policy, optimizer, parts, spec, records, prompts_ids, advantages), flops, peak_tflops,
        )  # fmt: skip
        if "skipped" not in result["grpo"]:
            result["grpo"].update(
                trained_steps=len(records), kl_beta=spec.grpo_kl_beta, noise_level=spec.grpo_noise_level,
                sde_rollout_s=round(sde_s, 4),
            )  # fmt: skip
    result["text_tower_reuse"] = text_kv.cache_of(policy.transformer).counts["reuse"] > 0
    del parts, policy, optimizer
    release(device)
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(steps.SIZES), default="nano")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", type=Path, default=None, help="diffusers folder whose architecture (and tokenizer) to use")
    parser.add_argument("--load-weights", action="store_true", help="with --model: load its safetensors weights too")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                        help="compute dtype (FSDP2 mixed precision); default bfloat16 on cuda, float32 on cpu")  # fmt: skip
    parser.add_argument("--iters", type=int, default=3, help="timed steps per step phase (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="rollouts timed per method (best kept)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no phase after this many seconds")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--rollout-samples", type=int, default=None,
                        help="samples per rollout (default: the size's, at nano 4 images as one rank of the public T2I "
                             "manifest and 2 clips as one rank of the public T2V manifest)")
    parser.add_argument("--phases", type=_phases, default=PHASES,
                        help=f"comma-separated phases to run, in their fixed order (default: all of {','.join(PHASES)})")  # fmt: skip
    parser.add_argument("--trace", type=Path, default=None,
                        help="with the video phase: write the profiled rollout step's Chrome trace to this file")  # fmt: skip
    return parser.parse_args(argv)


PHASES = ("nft_policy_only", "rollout", "nft", "dpo", "generation_targets", "video")
DEFAULT_TARGET_PHASES = PHASES[:4]  # these share the default-targets model, built once


def _phases(text: str) -> tuple[str, ...]:
    asked = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in asked if name not in PHASES]
    if unknown or not asked:
        raise argparse.ArgumentTypeError(f"unknown phase(s) {unknown or text!r}; choose from {','.join(PHASES)}")
    return tuple(name for name in PHASES if name in asked)


def _not_asked() -> dict:
    return {"skipped": "not asked for (--phases)"}


def _device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("gpu_check: --device cuda asked for but torch sees no GPU; run with --size tiny --device cpu")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


def build(args, spec, device, adapters, targets=None):
    parts = steps.build_parts(args.size, device, folder=args.model, load_weights=args.load_weights)
    if args.gradient_checkpointing:
        parts.transformer.enable_gradient_checkpointing()
    policy, optimizer = steps.make_policy(
        parts, device, spec, adapters, mixed_precision=args.dtype == "bfloat16", targets=targets
    )
    if targets is not None:
        policy.bench_targets = list(targets)
    return parts, policy, optimizer


def run(args) -> dict:
    from cosmos_rl.dist import world
    from cosmos_rl.dist.fsdp import quiet_view_output_warning

    clock = Clock(args.budget_s)
    if args.size == "nano" and args.device == "cpu" and args.model is None:
        sys.exit("gpu_check: --size nano is about 60 GB of fp32 weights, for a GPU; on CPU use --size tiny or small")
    device = _device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # on a shared CPU machine more threads mostly spin
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    spec = steps.SIZES[args.size]
    if args.rollout_samples is not None:
        if args.rollout_samples < 1:
            sys.exit(f"gpu_check: --rollout-samples must be at least 1, got {args.rollout_samples}")
        spec = dataclasses.replace(spec, rollout_samples=args.rollout_samples)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak_tflops = mfu.peak_bf16_tflops(device_name) if device.type == "cuda" and args.dtype == "bfloat16" else None
    quiet_view_output_warning()
    store = os.path.join(tempfile.mkdtemp(prefix="gpu-check-"), "store")
    world.init_process_group(device, 0, 1, 600.0, store_file=store)
    result: dict = {
        "bench": "gpu_check", "date": datetime.date.today().isoformat(), "device": device_name,
        "peak_bf16_tflops": peak_tflops, "size": args.size, "model": str(args.model) if args.model else "random",
        "dtype": args.dtype, "world_size": 1, "fsdp2": True, "gradient_checkpointing": args.gradient_checkpointing,
        "torch": torch.__version__,
    }  # fmt: skip
    try:
        default_trainable = None
        result.update({phase: _not_asked() for phase in DEFAULT_TARGET_PHASES})  # a phase left out says so
        if set(args.phases) & set(DEFAULT_TARGET_PHASES):
            default_trainable = _default_target_phases(args, spec, device, clock, peak_tflops, result)
        result["generation_targets"] = (
            generation_targets_phase(args, spec, device, clock, default_trainable)
            if "generation_targets" in args.phases else _not_asked()
        )  # fmt: skip
        result["video"] = video_phase(args, device, clock, peak_tflops) if "video" in args.phases else _not_asked()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    result["wall_s"] = round(clock.elapsed(), 1)
    return result


def _default_target_phases(args, spec, device, clock, peak_tflops, result: dict) -> int:
    """The phases on the default (both towers) targets; returns the default adapter's trainable size."""
    started = time.perf_counter()
    parts, policy, optimizer = build(args, spec, device, (steps.POLICY,))
    result["build_s"] = round(time.perf_counter() - started, 2)
    config = parts.transformer.config
    flops = Flops(config, spec.lora_rank, steps.vision_tokens(parts, spec.image))
    nft = steps.make_batch(parts, spec.nft_rows * spec.timesteps_per_sample, spec.image, device, seed=1)
    result["model_config"] = {
        k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "head_dim", "latent_channel", "latent_patch_size", "vocab_size")
    }  # fmt: skip
    result["model_config"].update(
        params_total=sum(p.numel() for p in parts.transformer.parameters()), params_per_token=flops.params,
        lora_rank=spec.lora_rank, image_size=spec.image, vision_tokens_per_image=flops.vision,
        text_tokens_mean=round(statistics.mean(nft.text_lens), 1),
    )  # fmt: skip
    result["nft_policy_only"] = _not_asked()
    if "nft_policy_only" in args.phases:
        watch = DtypeWatch(policy.transformer)
        result["nft_policy_only"] = step_phase(
            clock, device, args.iters,
            lambda: steps.nft_step(policy, optimizer, nft, with_old=False, kl_beta=0.0), flops, nft.text_lens, peak_tflops,
        )  # fmt: skip
        result["dtypes"] = watch.report(policy.trainable_parameters(), optimizer)
    del parts, policy, optimizer
    release(device)

    parts, policy, optimizer = build(args, spec, device, (steps.POLICY, steps.OLD))
    result["rollout"], result["nft"], result["dpo"] = _not_asked(), _not_asked(), _not_asked()
    if "rollout" in args.phases:
        result["rollout"] = rollout_phase(parts, policy, spec, device, clock, args.repeats, flops, peak_tflops)
    if "nft" in args.phases:
        result["nft"] = step_phase(
            clock, device, args.iters,
            lambda: steps.nft_step(policy, optimizer, nft, with_old=True, kl_beta=1.0), flops, nft.text_lens, peak_tflops,
        )  # fmt: skip
    if "dpo" in args.phases:
        dpo = steps.dpo_batch(parts, spec.dpo_pairs, spec.image, device, seed=2)
        result["dpo"] = step_phase(
            clock, device, args.iters, lambda: steps.dpo_step(policy, optimizer, dpo), flops, dpo.text_lens, peak_tflops,
        )  # fmt: skip
    for phase in ("rollout", "nft", "dpo"):
        if "skipped" not in result[phase]:
            result[phase].update(towers_columns(policy))
    default_trainable = sum(p.numel() for p in policy.trainable_parameters())
    result["memory"] = _memory(result, device)
    del parts, policy, optimizer
    release(device)
    return default_trainable


def _memory(result: dict, device: torch.device) -> dict:
    kind = "cuda_max_memory_allocated" if device.type == "cuda" else "cpu_peak_rss"
    memory = {"kind": kind, "goal_ratio": 1.10, "peak_mib": peak_mib(device)}
    only, full = result["nft_policy_only"].get("peak_memory_mib"), result["nft"].get("peak_memory_mib")
    if device.type == "cuda" and only and full:
        memory.update(policy_only_nft_peak_mib=only, policy_old_ref_nft_peak_mib=full, ratio=round(full / only, 4))
    else:
        memory["ratio"] = None  # CPU peak RSS only grows within a process: see bench/nft_bench.py --memory
    return memory


def main() -> None:
    print(steps.dumps(run(parse_args())), flush=True)
    # A gloo/nccl world sometimes aborts at interpreter exit after all work is done; leave directly.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
