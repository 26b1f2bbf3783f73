"""What the speed benches run: a Cosmos3 model at a named size, its LoRA policy, and NFT- and
DPO-shaped steps and rollouts built from the project's own pieces (no trainer, no Ray).

Sizes (the transformer; the tokenizer is the built-in byte-level one unless a folder gives one):
- "tiny": the built-in tiny preset (about 0.2 M parameters, 32x32 images), for CPU tests.
- "small": the tiny preset's VAE and tokenizer with a wider transformer (hidden 512, 4 layers,
  about 25 M parameters), so that on CPU the model, not the libraries, moves the memory figures.
- "nano": a Nano-like Cosmos3 (`NANO_TRANSFORMER`, about 15.2 B parameters, 6.95 B of them on one
  token's path) with a Wan2.2-style VAE (`NANO_VAE`: 48 latent channels, 16x spatial) at 512x512,
  random weights. Assumed, not read from a checkpoint: the transformer numbers are diffusers'
  Cosmos3OmniTransformer defaults (the layout the public Nano recipes load: 48 latent channels,
  2x2 patches, 151936-token vocabulary) and the VAE is the one that layout's 48 channels imply.
  Give `--model FOLDER` to take both from a real diffusers folder instead.

The policy is built the way `cosmos_rl.models.setup.build_trainable` builds it (LoRA adapters under
their own seed, train mode, FSDP2 with bf16 mixed precision over the default process group), from
parts built here instead of from a RunConfig: the Nano-like model has no preset, and writing 60 GB
of random weights to a folder only to read them back would eat the GPU slot.
"""

from __future__ import annotations

import functools
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse
from cosmos_rl.algorithms.nft import nft_loss
from cosmos_rl.core import schema
from cosmos_rl.dist.world import process_group_active
from cosmos_rl.core.flow import noisy_latents, velocity_target
from cosmos_rl.models import lora, text_kv
from cosmos_rl.core import media
from cosmos_rl.models.build import ModelParts, build_preset, flow_scheduler, load_parts
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.sampling import sample_latents
from cosmos_rl.models.setup import TrainableModel, build_optimizer
from cosmos_rl.models.text import tokenize_prompts
from cosmos_rl.models.architectures import TINY_VAE
from cosmos_rl.models.vae import decode_clips, decode_latents

POLICY, OLD = "policy", "old"
PROMPTS = ("a red cube", "a blue sphere on a wooden table", "a green cube", "a yellow sphere in the rain")

# diffusers 0.42 Cosmos3OmniTransformer defaults, written out so a changed default cannot move the figures.
NANO_TRANSFORMER = dict(
    hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, latent_channel=48, latent_patch_size=2, patch_latent_dim=192,
    rope_axes_dim=[24, 20, 20], vocab_size=151936,
)  # fmt: skip
# Wan2.2-style VAE: patchify 2 then three 2x downsamples, 48 latent channels, residual blocks.
NANO_VAE = dict(
    base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
    temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
    scale_factor_spatial=16, scale_factor_temporal=4, latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
)  # fmt: skip
SMALL_TRANSFORMER = dict(
    hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
    head_dim=64, latent_channel=4, latent_patch_size=2, patch_latent_dim=16, rope_axes_dim=[16, 8, 8],
)  # fmt: skip


@dataclass(frozen=True)
class Size:
    """The work one bench run does at a size (NFT numbers follow the public T2I NFT manifest at nano)."""

    image: int
    lora_rank: int
    lora_alpha: float
    sample_steps: int
    shift: float
    guidance: float
    rollout_samples: int
    nft_rows: int
    timesteps_per_sample: int
    dpo_pairs: int


SIZES = {
    "tiny": Size(32, 8, 16.0, 4, 3.0, 3.0, 4, 2, 2, 2),
    "small": Size(32, 8, 16.0, 4, 3.0, 3.0, 4, 4, 2, 4),
    "nano": Size(512, 32, 64.0, 20, 5.0, 3.0, 4, 4, 2, 4),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds `fn` takes, with queued device work drained before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def _folder_tokenizer(folder: Path):
    from transformers import PreTrainedTokenizerFast

    # A diffusers Cosmos3OmniPipeline folder calls its tokenizer `text_tokenizer`.
    sub = folder / "tokenizer" if (folder / "tokenizer").is_dir() else folder / "text_tokenizer"
    return PreTrainedTokenizerFast.from_pretrained(sub, local_files_only=True)


def _from_folder_config(folder: Path, device: torch.device) -> ModelParts:
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    with torch.device(device):
        transformer = Cosmos3OmniTransformer.from_config(Cosmos3OmniTransformer.load_config(folder / "transformer"))
        vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(folder / "vae"))
    return ModelParts(transformer=transformer, vae=vae, tokenizer=_folder_tokenizer(folder), scheduler=flow_scheduler())


def build_parts(
    size: str, device: torch.device, *, folder: Optional[Path] = None, load_weights: bool = False, seed: int = 0
) -> ModelParts:
    """The model at `size` (or `folder`'s architecture; its weights too with `load_weights`) on `device`.

    Random weights are made on the device itself: 15 B fp32 parameters would take minutes on a CPU.
    """
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    torch.manual_seed(seed)
    if folder is not None and load_weights:
        parts = load_parts(folder)
    elif folder is not None:
        parts = _from_folder_config(folder, device)
    elif size == "nano":
        from cosmos_rl.models.tokenizer import build_tiny_tokenizer

        with torch.device(device):
            transformer = Cosmos3OmniTransformer(**NANO_TRANSFORMER, dtype="float32")
            vae = AutoencoderKLWan(**NANO_VAE)
        parts = ModelParts(transformer, vae, build_tiny_tokenizer(), flow_scheduler())
    else:
        parts = build_preset("tiny", seed=seed)
        if size == "small":
            parts.transformer = Cosmos3OmniTransformer(
                **SMALL_TRANSFORMER, vocab_size=len(parts.tokenizer), dtype="float32"
            )
    parts.vae.requires_grad_(False)
    parts.vae.eval()
    parts.vae.to(device)
    parts.transformer.to(device)
    return parts


def make_policy(
    parts: ModelParts, device: torch.device, spec: Size, adapters: tuple[str, ...], *, mixed_precision: bool, seed: int = 0,
    targets: Optional[list[str]] = None,
) -> tuple[TrainableModel, torch.optim.Optimizer]:
    """LoRA adapters `adapters` ("policy" first) on the transformer (on `targets`: module or tower
    names, None = the defaults), FSDP2 when a group is up, AdamW."""
    transformer = parts.transformer
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 7919)
        lora.add_adapters(transformer, spec.lora_rank, spec.lora_alpha, list(adapters), targets)
    transformer.train()
    sharded = process_group_active()
    if sharded:
        from cosmos_rl.dist.fsdp import shard_transformer

        shard_transformer(transformer, mixed_precision=mixed_precision)
    if OLD in adapters:
        lora.copy_adapter(transformer, POLICY, OLD)
        activate(transformer, POLICY)
    policy = TrainableModel(parts=parts, lora=True, adapter_names=adapters, sharded=sharded, device=device)
    optimizer, _ = build_optimizer(policy.trainable_parameters(), schema.OptimizerConfig())
    return policy, optimizer


def activate(transformer: torch.nn.Module, name: str) -> None:
    """Forwards use adapter `name`; only "policy" stays trainable (as the NFT trainer keeps it)."""
    lora.set_active(transformer, name)
    if name != POLICY:
        for param in lora.adapter_tensors(transformer, name).values():
            param.requires_grad_(False)
        for param in lora.adapter_tensors(transformer, POLICY).values():
            param.requires_grad_(True)


# ------------------------------------------------------------------------------------------ batches
@dataclass
class Batch:
    """One forward's samples: noisy latents, times, prompt ids, targets, and per-sample weights."""

    x_t: torch.Tensor
    t: torch.Tensor
    ids: list[torch.Tensor]
    target: torch.Tensor
    weight: torch.Tensor  # NFT optimality r per sample
    timing: dict = field(default_factory=dict)  # a clip's fps and temporal factor (media.frame_timing); {} for images

    @property
    def text_lens(self) -> list[int]:
        return [int(i.numel()) for i in self.ids]


def latent_shape(parts: ModelParts, image: int) -> tuple[int, int, int, int]:
    return media.latent_shape(media.MediaSpec.image(image), parts.vae.config, parts.transformer.config)


def vision_tokens(parts: ModelParts, image: int) -> int:
    _, _, h, w = latent_shape(parts, image)
    patch = int(parts.transformer.config.latent_patch_size)
    return -(-h // patch) * -(-w // patch)


def prompt_ids(parts: ModelParts, count: int, image: int, device: torch.device):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    cond, uncond = tokenize_prompts(parts.tokenizer, prompts, resolution=(image, image))
    return prompts, [c.to(device) for c in cond], [u.to(device) for u in uncond]


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen)


def make_batch(parts: ModelParts, samples: int, image: int, device: torch.device, seed: int) -> Batch:
    """`samples` NFT training samples: random clean latents and noise at random times, one prompt each."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = latent_shape(parts, image)
    x0, eps, t = _randn(gen, samples, *shape), _randn(gen, samples, *shape), torch.rand(samples, generator=gen)
    weight = torch.rand(samples, generator=gen)
    _, ids, _ = prompt_ids(parts, samples, image, device)
    x0, eps, t = x0.to(device), eps.to(device), t.to(device)
    return Batch(noisy_latents(x0, eps, t), t, ids, velocity_target(x0, eps), weight.to(device))


def dpo_batch(parts: ModelParts, pairs: int, image: int, device: torch.device, seed: int) -> Batch:
    """2P samples, winners then losers; a pair shares its prompt, noise and t, as DPO pairs do."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = latent_shape(parts, image)
    x0, eps, t = _randn(gen, 2 * pairs, *shape), _randn(gen, pairs, *shape), torch.rand(pairs, generator=gen)
    _, ids, _ = prompt_ids(parts, pairs, image, device)
    x0, eps2, t2 = x0.to(device), torch.cat([eps, eps]).to(device), torch.cat([t, t]).to(device)
    ones = torch.ones(2 * pairs, device=device)
    return Batch(noisy_latents(x0, eps2, t2), t2, ids + ids, velocity_target(x0, eps2), ones)


# -------------------------------------------------------------------------------------------- steps
def nft_step(policy: TrainableModel, optimizer, batch: Batch, *, with_old: bool, kl_beta: float) -> dict:
    """The NFT trainer's train phase on one batch: no-grad old (and reference) forwards, the
    policy forward and backward, AdamW, the old-adapter blend. Returns the forward counts."""
    transformer = policy.transformer
    with torch.no_grad():
        v_old = v_ref = None
        if with_old:
            activate(transformer, OLD)
            v_old = counted_velocity(transformer, batch.x_t, batch.t, batch.ids, **batch.timing)
            activate(transformer, POLICY)
        if kl_beta:
            with policy.reference() as ref:
                v_ref = counted_velocity(ref, batch.x_t, batch.t, batch.ids, **batch.timing)
    v_theta = counted_velocity(transformer, batch.x_t, batch.t, batch.ids, **batch.timing)
    detached = v_theta.detach()
    loss, _ = nft_loss(
        v_theta, v_old if v_old is not None else detached, v_ref if v_ref is not None else detached,
        batch.target, batch.weight, beta=1.0, policy_loss_scale=1.0, kl_beta=kl_beta,
    )  # fmt: skip
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    text_kv.new_step()  # as models/setup.optimizer_step ends a step's text-tower reuse
    if with_old:
        lora.blend_adapter(transformer, OLD, POLICY, keep=0.5)
    return {"no_grad_forwards": int(with_old) + int(bool(kl_beta)), "grad_forwards": 1}


def dpo_step(policy: TrainableModel, optimizer, batch: Batch) -> dict:
    """The DPO trainer's model work on one batch of pairs (winners then losers, sharing noise and t):
    a no-grad reference forward and a policy forward+backward of all 2P samples, AdamW."""
    pairs = batch.x_t.shape[0] // 2
    with torch.no_grad(), policy.reference() as ref:
        mse_ref = per_sample_mse(velocity(ref, batch.x_t, batch.t, batch.ids), batch.target)
    mse = per_sample_mse(velocity(policy.transformer, batch.x_t, batch.t, batch.ids), batch.target)
    loss, _ = dpo_loss(mse[:pairs], mse[pairs:], mse_ref[:pairs], mse_ref[pairs:], 1000.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    text_kv.new_step()
    return {"no_grad_forwards": 1, "grad_forwards": 1}


# ----------------------------------------------------------------------------------------- rollouts
def stock_attention(transformer: torch.nn.Module) -> None:
    """Put diffusers' own attention processor back (packing.velocity installs its packed one)."""
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, Cosmos3PackedMoTAttention

    for module in transformer.modules():
        if isinstance(module, Cosmos3PackedMoTAttention):
            module.set_processor(Cosmos3AttnProcessor())


def packed_rollout(parts: ModelParts, transformer, spec: Size, noise: torch.Tensor, cond, uncond) -> torch.Tensor:
    """The NFT trainer's rollout: every sample (and its CFG branch) in one packed forward per step,
    decoded; as in the trainer, a sharded model's layers stay gathered for the whole sampling loop."""
    from cosmos_rl.dist.fsdp import gathered_while_sampling

    with torch.no_grad(), gathered_while_sampling(transformer):
        fn = functools.partial(velocity, transformer)
        x0, _ = sample_latents(fn, noise, cond, uncond, spec.sample_steps, spec.shift, spec.guidance)
        return decode_latents(parts.vae, x0)


def pipeline_rollout(parts: ModelParts, transformer, spec: Size, noise: torch.Tensor, prompts: list[str]) -> None:
    """The same samples through diffusers' Cosmos3OmniPipeline, one call per sample, stock attention."""
    from diffusers import Cosmos3OmniPipeline

    stock_attention(transformer)
    pipe = Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=parts.tokenizer, vae=parts.vae,
        scheduler=flow_scheduler(spec.shift), enable_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        for prompt, latent in zip(prompts, noise):
            pipe(
                prompt=prompt, num_frames=1, height=spec.image, width=spec.image,
                num_inference_steps=spec.sample_steps, guidance_scale=spec.guidance,
                latents=latent[None], output_type="pt", enable_safety_check=False,
            )  # fmt: skip


def rollout_noise(parts: ModelParts, samples: int, image: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(samples, *latent_shape(parts, image), generator=gen).to(device)


# -------------------------------------------------------------------------------------------- video
# The tiny preset's VAE with its one downsampling stage made temporal too (as the video shapes
# base's is): 5 frames of 32x48 are 3 latent frames of 8x12 cells, so the tiny video run goes
# through temporal compression and fractional time positions as the Nano-like VAE's 4x does.
TINY_VIDEO_VAE = dict(TINY_VAE, temperal_downsample=[True], scale_factor_temporal=2)


@dataclass(frozen=True)
class VideoSize:
    """The work of the video phases at a size. At nano: one rank's share of
    manifests/nft_t2v_public_8gpu.toml (832x480, 17 frames at 16 fps, LoRA rank 32 on the generation
    tower, 10 CFG-free sampler steps, 2 clips a rollout, 2 rows x 4 timesteps an NFT forward, no KL);
    GRPO as Flow-GRPO-Fast (a 2-step SDE window, both steps trained, KL 0.04, the public GRPO
    manifest's a = 0.7). The shift (5, as the image sizes) replaces the folder's own, which the
    random Nano-like model does not have."""

    frames: int
    height: int
    width: int
    fps: float
    lora_rank: int
    lora_alpha: float
    sample_steps: int
    shift: float
    guidance: float
    rollout_samples: int
    nft_rows: int
    timesteps_per_sample: int
    nft_kl_beta: float
    grpo_window: int
    grpo_kl_beta: float
    grpo_noise_level: float
    targets: tuple[str, ...]

    @property
    def media(self) -> media.MediaSpec:
        return media.MediaSpec(frames=self.frames, height=self.height, width=self.width, fps=self.fps)


_TINY_VIDEO = VideoSize(5, 32, 48, 16.0, 8, 16.0, 3, 3.0, 1.0, 2, 2, 2, 0.0, 2, 0.04, 0.7, ("generation",))
VIDEO_SIZES = {
    "tiny": _TINY_VIDEO,
    "small": _TINY_VIDEO,
    "nano": VideoSize(17, 480, 832, 16.0, 32, 64.0, 10, 5.0, 1.0, 2, 2, 4, 0.0, 2, 0.04, 0.7, ("generation",)),
}


def build_video_parts(
    size: str, device: torch.device, *, folder: Optional[Path] = None, load_weights: bool = False, seed: int = 0
) -> ModelParts:
    """`build_parts`, with a VAE that compresses time at the CPU sizes (`TINY_VIDEO_VAE`); nano's
    Wan2.2-style VAE and a folder's own already do."""
    parts = build_parts(size, device, folder=folder, load_weights=load_weights, seed=seed)
    if folder is None and size != "nano":
        from diffusers import AutoencoderKLWan

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            vae = AutoencoderKLWan(**TINY_VIDEO_VAE)
        vae.requires_grad_(False)
        parts.vae = vae.eval().to(device)
    return parts


def video_prompt_ids(parts: ModelParts, count: int, spec: VideoSize, device: torch.device):
    """(prompts, cond, uncond) as the pipeline builds them for a clip (video system prompt, duration
    and resolution sentences)."""
    from cosmos_rl.models.text import model_prompt_ids

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    cond, uncond = model_prompt_ids(parts.tokenizer, "chat", prompts, spec.media)
    return prompts, [c.to(device) for c in cond], [u.to(device) for u in uncond]


def video_latent_shape(parts: ModelParts, spec: VideoSize) -> tuple[int, int, int, int]:
    return media.latent_shape(spec.media, parts.vae.config, parts.transformer.config)


def video_timing(parts: ModelParts, spec: VideoSize) -> dict:
    """The packed forward's fps and temporal factor for `spec`'s clips (as the trainers pass them)."""
    return media.frame_timing(spec.media, parts.vae.config)


def video_noise(parts: ModelParts, samples: int, spec: VideoSize, device: torch.device) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(samples, *video_latent_shape(parts, spec), generator=gen).to(device)


def video_batch(parts: ModelParts, samples: int, spec: VideoSize, device: torch.device, seed: int) -> Batch:
    """`samples` NFT training clips: random clean latents and noise at random times, one prompt each."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = video_latent_shape(parts, spec)
    x0, eps, t = _randn(gen, samples, *shape), _randn(gen, samples, *shape), torch.rand(samples, generator=gen)
    weight = torch.rand(samples, generator=gen)
    _, ids, _ = video_prompt_ids(parts, samples, spec, device)
    x0, eps, t = x0.to(device), eps.to(device), t.to(device)
    return Batch(noisy_latents(x0, eps, t), t, ids, velocity_target(x0, eps), weight.to(device), video_timing(parts, spec))


# ------------------------------------------------------------------------------ forwards, for FLOPs
@dataclass(frozen=True)
class Forward:
    """One packed forward: with a graph or not, whether it read held text keys/values (text-tower
    reuse: the text tower did no work), each sample's text and vision token counts."""

    grad: bool
    text_reused: bool
    text_lens: tuple[int, ...]
    vision_lens: tuple[int, ...]


_FORWARDS: Optional[list[Forward]] = None


@contextmanager
def recorded_forwards():
    """Yields a list that every `counted_velocity` inside the block appends its `Forward` to."""
    global _FORWARDS
    outer, _FORWARDS = _FORWARDS, []
    try:
        yield _FORWARDS
    finally:
        _FORWARDS = outer


def counted_velocity(transformer, x_t: torch.Tensor, sigma: torch.Tensor, prompt_ids: list[torch.Tensor], **kwargs):
    """`packing.velocity`, recorded (inside `recorded_forwards`) so a phase's FLOPs count the
    forwards it ran as they ran: reused or not (`text_kv` counts a forward's plan), grad or not."""
    counts = text_kv.cache_of(transformer).counts
    reused_before = counts["reuse"]
    out = velocity(transformer, x_t, sigma, prompt_ids, **kwargs)
    if _FORWARDS is not None:
        patch = int(transformer.config.latent_patch_size)
        per_sample = int(x_t.shape[2]) * -(-int(x_t.shape[3]) // patch) * -(-int(x_t.shape[4]) // patch)
        _FORWARDS.append(Forward(
            torch.is_grad_enabled(), counts["reuse"] > reused_before,
            tuple(int(ids.numel()) for ids in prompt_ids), (per_sample,) * len(prompt_ids),
        ))  # fmt: skip
    return out


# ----------------------------------------------------------------------------------- video rollouts
def packed_video_rollout(parts: ModelParts, transformer, spec: VideoSize, noise: torch.Tensor, cond, uncond) -> torch.Tensor:
    """The NFT trainer's T2V rollout (`OnlineTrainer.rollout`): every clip in one packed forward per
    sampler step at the clips' time positions, layers gathered and the text tower's keys/values held
    for the loop; decoded. Returns the clips [B, F, 3, H, W] in [0, 1]."""
    from cosmos_rl.dist.fsdp import gathered_while_sampling

    fn = functools.partial(counted_velocity, transformer, **video_timing(parts, spec))
    with torch.no_grad(), gathered_while_sampling(transformer), text_kv.held_while_sampling(transformer):
        x0, _ = sample_latents(fn, noise, cond, uncond, spec.sample_steps, spec.shift, spec.guidance)
        return decode_clips(parts.vae, x0).permute(0, 2, 1, 3, 4)


def pipeline_video_rollout(parts: ModelParts, transformer, spec: VideoSize, noise: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """The same clips through diffusers' Cosmos3OmniPipeline, one call per clip, stock attention.
    Returns the clips [B, F, 3, H, W] in [0, 1] (the pipeline's "pt" output)."""
    from diffusers import Cosmos3OmniPipeline

    stock_attention(transformer)
    pipe = Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=parts.tokenizer, vae=parts.vae,
        scheduler=flow_scheduler(spec.shift), enable_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    clips = []
    with torch.no_grad():
        for prompt, latent in zip(prompts, noise):
            clips.append(pipe(
                prompt=prompt, num_frames=spec.frames, height=spec.height, width=spec.width, fps=spec.fps,
                num_inference_steps=spec.sample_steps, guidance_scale=spec.guidance,
                latents=latent[None], output_type="pt", enable_safety_check=False,
            ).video)  # fmt: skip
    return torch.stack(clips)


# -------------------------------------------------------------------------------------------- GRPO
def guided(transformer, prompt_ids, spec: VideoSize, timing: dict):
    """The GRPO trainer's guided velocity (`trainers.grpo.guided_velocity`) through `counted_velocity`."""
    from cosmos_rl.trainers.grpo import guided_velocity

    forward = functools.partial(counted_velocity, **timing)
    return lambda x, sigma: guided_velocity(transformer, prompt_ids, spec.guidance, x, sigma, forward)


def grpo_rollout(parts: ModelParts, transformer, spec: VideoSize, noise: torch.Tensor, prompt_ids):
    """The GRPO trainer's rollout (`GRPOTrainer.sample`, without decoding): the SDE sampler with a
    `spec.grpo_window`-step window at the start; returns its step records (the replay `learn` trains on)."""
    from cosmos_rl.algorithms import grpo_sampler
    from cosmos_rl.dist.fsdp import gathered_while_sampling
    from cosmos_rl.models.sampling import sampler_sigmas

    sigmas = sampler_sigmas(spec.sample_steps, spec.shift, None, noise.device)
    gen = torch.Generator(device=noise.device).manual_seed(11)
    window = grpo_sampler.sde_window(spec.sample_steps, spec.grpo_window, 0)
    fn = guided(transformer, prompt_ids, spec, video_timing(parts, spec))
    with torch.no_grad(), gathered_while_sampling(transformer), text_kv.held_while_sampling(transformer):
        _, records = grpo_sampler.sample_sde(fn, noise, sigmas, spec.grpo_noise_level, gen, window, "sde")
    return records


def grpo_step(policy: TrainableModel, optimizer, parts: ModelParts, spec: VideoSize, records, prompt_ids,
              advantages: torch.Tensor) -> dict:
    """The GRPO trainer's learn (`GRPOTrainer.learn` / `_step_loss`, one update a step): for every
    trained step, the reference's no-grad step mean (the KL), the policy's step mean, the log-prob
    of the recorded step, the clipped surrogate plus KL, one backward each; layers gathered for the
    step; AdamW. Returns the forward counts."""
    from cosmos_rl.algorithms import grpo as grpo_math
    from cosmos_rl.dist.fsdp import gathered_while_training

    transformer, timing = policy.transformer, video_timing(parts, spec)
    optimizer.zero_grad(set_to_none=True)
    with gathered_while_training(transformer):
        for record in records:
            x, s, s_next = record.x, record.sigma, record.sigma_next
            sigma = s.expand(x.shape[0])
            with torch.no_grad(), policy.reference() as ref:
                v_ref = guided(ref, prompt_ids, spec, timing)(x, sigma)
                mean_ref, _ = grpo_math.step_mean_std("sde", x, v_ref, s, s_next, spec.grpo_noise_level)
            v = guided(transformer, prompt_ids, spec, timing)(x, sigma)
            mean, std = grpo_math.step_mean_std("sde", x, v, s, s_next, spec.grpo_noise_level)
            logp = grpo_math.step_log_prob(record.x_next, mean, std)
            kl = grpo_math.step_kl(mean, mean_ref, std, s, s_next)
            loss, _ = grpo_math.grpo_step_loss(logp, record.log_prob, advantages, kl, kl_beta=spec.grpo_kl_beta)
            (loss / len(records)).backward()
    optimizer.step()
    text_kv.new_step()
    return {"no_grad_forwards": len(records), "grad_forwards": len(records)}


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1)
