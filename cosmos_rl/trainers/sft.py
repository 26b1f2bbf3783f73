"""Supervised fine-tuning on image-caption data: flow matching for the transformer, or the VAE as
an autoencoder (`rl.train`).

Runs the same in one process (tests, `python -m cosmos_rl.shapes.base_build`) and under torchrun
(`cosmos-rl train`, one process per rank, launched like DPO by `trainers/spmd_launch.py` and
`trainers/spmd_worker.py`). The step loop, metrics, cadence and preemption are `trainers/loop`'s.

Per step, on each rank: its share of the step's samples (a `PairCursor` over the source's indices)
-> images [B, 3, H, W] ->
- `transformer`: frozen-VAE latents x0 (posterior mean) -> eps, t ~ U(0, 1) and the caption-dropout
  draws from a generator seeded by (job.seed, step, rank), so a resumed run redraws them exactly ->
  x_t -> ONE packed velocity forward -> `flow_matching_loss`;
- `vae`: posterior mean -> decode -> `reconstruction_loss` on [-1, 1] pixels (metric `train/psnr`);
-> backward, gradient averaging over ranks (FSDP2 for the transformer, an all-reduce for the VAE),
clipping, AdamW, LR schedule.

With `rl.eval.every`, the held-out prompts are sampled and scored every that many steps (`eval/`
metrics, `evaluation.during`); in `vae` mode the frozen transformer samples and the VAE being trained
decodes.

A checkpoint holds the `policy` component (the trained transformer, LoRA tensors only with LoRA,
or the trained VAE), optimizer, LR schedule, step, data cursor and every rank's RNG streams.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cosmos_rl import plan
from cosmos_rl.algorithms.sft import flow_matching_loss, psnr_db, reconstruction_loss
from cosmos_rl.checkpoint import (
    CheckpointManager,
    LRScheduleState,
    ModelState,
    OptimizerState,
    PlainState,
    RngStreams,
    layout,
)
from cosmos_rl.config import schema
from cosmos_rl.data.captions import caption_source
from cosmos_rl.data.cursor import PairCursor
from cosmos_rl.dist.world import process_group_active, rank_and_world
from cosmos_rl.flow import noisy_latents
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.setup import TrainableModel, build_optimizer, build_trainable, load_base, optimizer_step
from cosmos_rl.models.text import model_prompt_ids
from cosmos_rl.models.vae import encode_images
from cosmos_rl.seeds import derive_seed
from cosmos_rl.trainers.loop import LoopSpec, run_rank_steps


class SFTTrainer:
    """One rank's share of an SFT run. `run()` trains to rl.max_steps; `train_step()` does one step."""

    def __init__(self, config: schema.RunConfig, run_dir: Path, device: torch.device, *, resume: bool = False):
        if not isinstance(config.rl, schema.SFTConfig):
            raise TypeError("SFTTrainer needs an SFT config")
        self.config, self.rl = config, config.rl
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device, self.resume = device, resume
        self.distributed = process_group_active()
        self.rank, self.world = rank_and_world()
        self.is_main = self.rank == 0
        self.step = 0
        self.source = caption_source(self.rl.data.shards, self.rl.data.jsonl, config.model.image_size)
        self.cursor = PairCursor(
            len(self.source), self.rl.samples_per_step, config.job.seed, self.world, self.rank, shuffle=self.rl.data.shuffle
        )
        self.train_vae = self.rl.train == "vae"
        if self.train_vae:
            self.parts = load_base(config)
            self.parts.transformer.requires_grad_(False)
            self.module: torch.nn.Module = self.parts.vae.to(device).requires_grad_(True).train()
            self.model: TrainableModel | None = None
        else:
            self.model = build_trainable(config, device, with_reference=False)
            self.parts = self.model.parts
            self.module = self.model.state_module()
        self._ids: dict[str, torch.Tensor] = {}
        self.evaluator = None
        if self.rl.eval.every:  # [rl.eval]: held-out prompts sampled with the current weights and scored (eval/ metrics)
            from cosmos_rl.evaluation.evaluator import Evaluator

            if self.train_vae:  # the frozen transformer samples, the VAE being trained decodes
                self.parts.transformer.to(device)
            self.evaluator = Evaluator.for_run(config, self.model if self.model is not None else self.parts, device)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer, self.schedule = build_optimizer(self.params, self.rl.optimizer)
        self.identity = plan.run_identity(config)
        self.checkpoints = CheckpointManager(self.run_dir, config.checkpoint.keep, run_identity=self.identity, algorithm="sft")
        if resume:
            self._load_latest()

    # -------------------------------------------------------------------------------- state
    def _components(self, *, with_rng: bool = True) -> dict[str, Any]:
        lora = self.model is not None and self.model.lora
        components: dict[str, Any] = {
            layout.POLICY: ModelState(self.module, trainable_only=lora),
            layout.OPTIMIZER: OptimizerState(self.module, self.optimizer),
            layout.LR_SCHEDULE: LRScheduleState(self.schedule),
            layout.PROGRESS: PlainState({"step": self.step}),
            layout.DATA_CURSOR: PlainState(self.cursor.state_dict()),
        }
        if with_rng:
            components[layout.RNG] = RngStreams()
        return components

    def _load_latest(self) -> None:
        """Continue from the newest loadable committed checkpoint (see DPOTrainer._load_latest)."""
        self.step, components = self.checkpoints.resume_for_world(
            self.world, lambda same_world: self._components(with_rng=same_world)
        )
        self.cursor.load_state_dict(components[layout.DATA_CURSOR].data)

    def save(self) -> Path:
        return self.checkpoints.save(self.step, self._components())

    # -------------------------------------------------------------------------------- math
    def prompt_ids(self, caption: str) -> torch.Tensor:
        ids = self._ids.get(caption)
        if ids is None:
            cond, uncond = model_prompt_ids(
                self.parts.tokenizer, self.parts.prompt_template, [caption], self.config.model.image_size
            )
            ids = self._ids[caption] = cond[0].to(self.device)
            self._ids.setdefault("", uncond[0].to(self.device))
        return ids

    def _images(self) -> tuple[torch.Tensor, list[str]]:
        samples = [self.source[i] for i in self.cursor.next_batch()]
        return torch.stack([s.image for s in samples]).to(self.device), [s.caption for s in samples]

    def _flow_loss(self, images: torch.Tensor, captions: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            x0 = encode_images(self.parts.vae, images)
        generator = torch.Generator().manual_seed(derive_seed("sft", self.config.job.seed, self.step, self.rank))
        eps = torch.randn(x0.shape, generator=generator).to(self.device)
        t = torch.rand(x0.shape[0], generator=generator).to(self.device)
        dropped = (torch.rand(x0.shape[0], generator=generator) < self.rl.caption_dropout).tolist()
        ids = [self.prompt_ids(c) for c in captions]
        ids = [self._ids[""] if drop else i for drop, i in zip(dropped, ids)]
        v = velocity(self.module, noisy_latents(x0, eps, t), t, ids)
        return flow_matching_loss(v, x0, eps), {"caption_dropped": sum(dropped) / len(dropped)}

    def _vae_loss(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        video = (images * 2.0 - 1.0).unsqueeze(2)  # [B, 3, 1, H, W] in the VAE's range
        decoded = self.module.decode(self.module.encode(video).latent_dist.mode()).sample
        loss = reconstruction_loss(decoded, video)
        return loss, {}

    def _all_mean(self, values: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values /= self.world
        return values

    def train_step(self) -> dict[str, float]:
        """One optimizer step; returns the rank-averaged train/ metrics."""
        started = time.perf_counter()
        images, captions = self._images()
        self.optimizer.zero_grad(set_to_none=True)
        loss, extra = self._vae_loss(images) if self.train_vae else self._flow_loss(images, captions)
        loss.backward()
        if self.train_vae and self.distributed:  # the VAE is replicated, not FSDP-sharded
            for p in self.params:
                if p.grad is not None:
                    self._all_mean(p.grad)
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        self.step += 1

        names = ["loss", *extra]
        reduced = self._all_mean(torch.tensor([float(loss.detach()), *extra.values()], dtype=torch.float64))
        out = {f"train/{k}": float(v) for k, v in zip(names, reduced)}
        if self.train_vae:
            out["train/psnr"] = psnr_db(out["train/loss"])
        out["train/grad_norm"] = float(grad_norm)
        out["train/lr"] = lr
        out["train/samples_per_s"] = self.rl.samples_per_step / max(time.perf_counter() - started, 1e-9)
        return out

    # -------------------------------------------------------------------------------- loop
    def _step(self, step: int) -> dict[str, float]:
        assert step == self.step + 1, f"the loop asked for step {step} after step {self.step}"
        return self.train_step()

    def evaluate(self, step: int) -> dict[str, float]:
        """[rl.eval] (collective): every rank samples its share of the items, one all-reduce sums the scores."""
        from cosmos_rl.evaluation.evaluator import evaluate_all_reduce

        transformer = self.parts.transformer if self.model is None else self.model.transformer
        return evaluate_all_reduce(self.evaluator, transformer, self.rank, self.world)

    def run(self) -> list[dict[str, float]]:
        """Train to rl.max_steps, writing metrics and checkpoints; returns the rows this call wrote."""
        spec = LoopSpec(
            run_dir=self.run_dir, start_step=self.step, resumed=self.resume, main=self.is_main,
            unit="samples", items_per_step=self.rl.samples_per_step,
            progress_fields=("train/loss", "train/psnr") if self.train_vae else ("train/loss",),
        )
        return run_rank_steps(self.config, spec, self._step, lambda step: self.save(), None, self.evaluate)


def train(config: schema.RunConfig, run_dir: Path, device: torch.device, *, resume: bool) -> list[dict]:
    """Build the trainer for this rank and run it to the end."""
    return SFTTrainer(config, run_dir, device, resume=resume).run()
