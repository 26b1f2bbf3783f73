"""Supervised fine-tuning on image-caption data: flow matching for the transformer, or the VAE as
an autoencoder (`rl.train`).

Runs the same in one process (tests, `python -m cosmos_rl.commands.base_build`) and under torchrun
(`cosmos-rl train`, one process per rank, launched like DPO by `trainers/spmd_launch.py` and
`trainers/spmd_worker.py`). The step loop, metrics, cadence and preemption are `trainers/loop`'s.

Per step, on each rank: its share of the step's samples (a `PairCursor` over the source's indices)
-> images [B, 3, H, W] ->
- `transformer`: frozen-VAE latents x0 (posterior mean) -> eps, t ~ U(0, 1) and the caption-dropout
  draws from a generator seeded by (job.seed, step, data-parallel rank), so a resumed run redraws
  them exactly ->
  x_t -> ONE packed velocity forward -> `flow_matching_loss`;
- `vae`: posterior mean -> decode -> `reconstruction_loss` on [-1, 1] pixels, foreground-weighted
  with `rl.foreground_weight` and, with `[rl.pixel_weights]`, by a suite verifier's pixel classes
  (`algorithms.sft.class_weights`) (metric `train/psnr` from the plain MSE);
-> backward, gradient averaging over ranks (FSDP2 for the transformer, an all-reduce for the VAE),
clipping, AdamW, LR schedule.

With `rl.eval.every`, the held-out prompts are sampled and scored every that many steps (`eval/`
metrics, `evaluation.during`); in `vae` mode the frozen transformer samples and the VAE being trained
decodes.

Context parallelism (`grid.context_parallel` = N > 1, docs/long_clips.md; the transformer only):
the world is data-parallel x N, consecutive N ranks one context group that trains one share of the
step's samples (`SPMDTrainer.data_rank`/`data_world`): the cursor and the noise draws go by the
data-parallel rank, every packed forward splits the vision tokens over the group, and the metric
means and [rl.eval] count each group once.

A checkpoint holds the `policy` component (the trained transformer, LoRA tensors only with LoRA,
or the trained VAE), optimizer, LR schedule, step, data cursor and every rank's RNG streams.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cosmos_rl.algorithms.sft import action_flow_loss, class_weights, flow_matching_loss, foreground_weights, psnr_db, reconstruction_loss, weighted_mse
from cosmos_rl.core import schema
from cosmos_rl.data.captions import caption_source
from cosmos_rl.data.cursor import PairCursor
from cosmos_rl.core.flow import noisy_latents, training_timesteps
from cosmos_rl.core.condition import Condition
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec, frame_timing
from cosmos_rl.data.episode_windows import lerobot_windows
from cosmos_rl.models.actions import ActionLayout, action_prompt_ids, hold_rows, model_rows
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.setup import TrainableModel, build_trainable, load_base, optimizer_step
from cosmos_rl.models.text import model_prompt_ids
from cosmos_rl.models.generate import encode_pixels
from cosmos_rl.models.vae import reconstruction
from cosmos_rl.core.seeds import derive_seed
from cosmos_rl.trainers.spmd import SPMDTrainer


def clip_classes(pixel_classes, clips: torch.Tensor) -> torch.Tensor:
    """int8 [B, 1, F, H, W]: a suite verifier's class of each pixel (`Suite.pixel_classes`) of clips
    [B, 3, F, H, W] in [-1, 1], judged as the verifier judges a sample (clamped, rounded to uint8)."""
    b, _, f, h, w = clips.shape
    frames = ((clips.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    frames = frames.permute(0, 2, 3, 4, 1).reshape(b * f, h, w, 3).cpu().numpy()
    return torch.from_numpy(pixel_classes(frames)).reshape(b, 1, f, h, w).to(clips.device)


class SFTTrainer(SPMDTrainer):
    """One rank's share of an SFT run (the calls: trainers/spmd.py)."""

    def setup(self) -> None:
        config = self.config
        if not isinstance(config.rl, schema.SFTConfig):
            raise TypeError("SFTTrainer needs an SFT config")
        device = self.device
        self.condition = Condition.from_model_config(config.model)
        if self.rl.data.lerobot:  # episode windows with their actions: the world model's teacher forcing
            self.source = lerobot_windows(self.rl.data.lerobot, self.rl.data.camera, self.media, self.condition.action.width)
        else:
            self.source = caption_source(self.rl.data.shards, self.rl.data.jsonl, self.media)
        self.cursor = PairCursor(
            # a context group's ranks walk one share (self.world, self.rank without context parallelism)
            len(self.source), self.rl.samples_per_step, config.job.seed, self.data_world, self.data_rank, shuffle=self.rl.data.shuffle
        )
        self.train_vae = self.rl.train == "vae"
        if self.train_vae:
            self.parts = load_base(config)
            self.parts.transformer.requires_grad_(False)
            self.module = self.parts.vae.to(device).requires_grad_(True).train()
            self.model: TrainableModel | None = None
            if self.rl.pixel_weights.suite:  # preflight checked the suite has pixel classes and the names
                from cosmos_rl.suites import registry

                suite = registry.get(self.rl.pixel_weights.suite)
                self.pixel_classes = suite.resolve("pixel_classes")
                self.class_ids = {suite.pixel_class_names.index(name) + 1: w for name, w in self.rl.pixel_weights.classes.items()}
        else:
            self.model = build_trainable(config, device, with_reference=False)
            self.parts = self.model.parts
            self.module = self.model.state_module()
            # grid.context_parallel: every packed forward splits its vision tokens over the context group.
            self.set_context_parallel(self.model.transformer)
        if self.condition.has_actions:  # the folder's transformer must carry action heads that fit the embodiment
            try:
                ActionLayout.of(self.condition.action, 1).check(self.parts.transformer.config)
            except ValueError as exc:
                raise UserError(f"model.path: {exc}; use a Cosmos3 folder built with action_gen = true (Cosmos3-Nano has them)") from None
            # Heads no loss reaches stay frozen (no gradient, so no optimizer state for a resume to
            # expect): the sound heads, and the action output projection when actions are only read.
            generates = any(spec.generates_actions for spec in self.condition.training_specs())
            unused = ("audio_",) if generates else ("audio_", "action_proj_out")
            for name, parameter in self.module.named_parameters():
                if name.startswith(unused):
                    parameter.requires_grad_(False)
        self.lora = self.model is not None and self.model.lora
        self._ids: dict[str, torch.Tensor] = {}
        self._action_ids: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.rl.eval.every:  # [rl.eval]: held-out prompts sampled with the current weights and scored (eval/ metrics)
            from cosmos_rl.evaluation.evaluator import Evaluator

            if self.train_vae:  # the frozen transformer samples, the VAE being trained decodes
                self.parts.transformer.to(device)
            self.evaluator = Evaluator.for_run(config, self.model if self.model is not None else self.parts, device)
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    @property
    def progress_fields(self) -> tuple[str, ...]:
        return ("train/loss", "train/psnr") if self.train_vae else ("train/loss",)

    def items_per_step(self) -> int:
        return self.rl.samples_per_step

    def sampling_transformer(self) -> torch.nn.Module:
        return self.parts.transformer if self.model is None else self.model.transformer

    # -------------------------------------------------------------------------------- math
    def prompt_ids(self, caption: str) -> torch.Tensor:
        ids = self._ids.get(caption)
        if ids is None:
            cond, uncond = model_prompt_ids(self.parts.tokenizer, self.parts.prompt_template, [caption], self.media)
            ids = self._ids[caption] = cond[0].to(self.device)
            self._ids.setdefault("", uncond[0].to(self.device))
        return ids

    def action_prompt_ids(self, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(cond, uncond) ids of an action run's structured caption of `caption` (the pipeline's)."""
        if caption not in self._action_ids:
            cond, uncond = action_prompt_ids(self.parts.tokenizer, self.parts.prompt_template, [caption], self.condition.action, self.media)
            self._action_ids[caption] = (cond[0].to(self.device), uncond[0].to(self.device))
        return self._action_ids[caption]

    def _images(self) -> tuple[torch.Tensor, list[str], torch.Tensor | None]:
        samples = [self.source[i] for i in self.cursor.next_batch()]
        actions = torch.stack([s.actions for s in samples]).to(self.device) if self.condition.has_actions else None
        return torch.stack([s.image for s in samples]).to(self.device), [s.caption for s in samples], actions

    def _world_loss(self, pixels: torch.Tensor, captions: list[str], raw: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Flow matching of an action mode (the world model): the given latent frames and action
        rows are held clean and left out of the loss; the generated ones (frames after frame 0
        unless inverse dynamics; the action rows unless forward dynamics) are noised at the
        sample's time t and trained toward eps - x0. The loss is the frames' mean plus the
        actions' mean (each over its generated elements; a term no sample generates is absent).
        With `model.condition.modes` each window draws its own mode (drawn last, so a one-mode
        run draws exactly what it did without them)."""
        specs = self.condition.training_specs()
        spec = specs[0]
        with torch.no_grad():
            x0 = encode_pixels(self.parts.vae, self.media, pixels)
        batch = x0.shape[0]
        generator = torch.Generator().manual_seed(derive_seed("sft", self.config.job.seed, self.step, self.data_rank))
        eps = torch.randn(x0.shape, generator=generator).to(self.device)
        t = training_timesteps(batch, generator, self.rl.timestep_sampling, self.rl.logit_mean, self.rl.logit_std).to(self.device)
        dropped = (torch.rand(batch, generator=generator) < self.rl.caption_dropout).tolist()
        a0 = model_rows(spec, raw.float(), int(self.parts.transformer.config.action_dim))
        eps_a = torch.randn(a0.shape, generator=generator).to(self.device)
        picks = torch.randint(len(specs), (batch,), generator=generator).tolist() if len(specs) > 1 else [0] * batch
        chosen = [specs[i] for i in picks]
        layout = ActionLayout(spec.chunk, (spec.domain_id,) * batch, (spec.width,) * batch, tuple(s.clean_rows for s in chosen))
        ids = [self.action_prompt_ids(c)[1 if drop else 0] for c, drop in zip(captions, dropped)]
        timing = frame_timing(self.media, self.parts.vae.config)
        clean = [s.clean_frames(timing.get("temporal_factor", 1)) for s in chosen]
        given = torch.arange(x0.shape[2], device=x0.device)[None, :] < torch.tensor(clean, device=x0.device)[:, None]  # [B, T]
        x_t = torch.where(given[:, None, :, None, None], x0, noisy_latents(x0, eps, t))
        a_t = hold_rows(noisy_latents(a0, eps_a, t), a0, layout)
        v, v_actions = velocity(self.module, x_t, t, ids, clean_frames=clean, actions=a_t, action_layout=layout, **timing)
        terms: dict[str, torch.Tensor] = {}
        if any(s.generates_frames for s in chosen):
            terms["frames_loss"] = flow_matching_loss(v, x0, eps, clean)
        if any(s.generates_actions for s in chosen):
            terms["actions_loss"] = action_flow_loss(v_actions, a0, eps_a, list(layout.clean_rows), list(layout.widths))
        loss = sum(terms.values())
        extra = {name: float(value.detach()) for name, value in terms.items()}
        extra["caption_dropped"] = sum(dropped) / batch
        for index, mode_spec in enumerate(specs if len(specs) > 1 else ()):
            extra[f"{mode_spec.mode}_share"] = picks.count(index) / batch
        return loss, extra

    def _flow_loss(self, pixels: torch.Tensor, captions: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            x0 = encode_pixels(self.parts.vae, self.media, pixels)
        generator = torch.Generator().manual_seed(derive_seed("sft", self.config.job.seed, self.step, self.data_rank))
        eps = torch.randn(x0.shape, generator=generator).to(self.device)
        t = training_timesteps(x0.shape[0], generator, self.rl.timestep_sampling, self.rl.logit_mean, self.rl.logit_std).to(self.device)
        dropped = (torch.rand(x0.shape[0], generator=generator) < self.rl.caption_dropout).tolist()
        ids = [self.prompt_ids(c) for c in captions]
        ids = [self._ids[""] if drop else i for drop, i in zip(dropped, ids)]
        x_t = noisy_latents(x0, eps, t)
        extra = {"caption_dropped": sum(dropped) / len(dropped)}
        clean: list[int] = []
        timing = frame_timing(self.media, self.parts.vae.config)
        if self.media.is_video:
            # Drawn for every clip run (conditioned or not) after the image run's draws, so an image
            # run consumes exactly what it did before and a T2V run what it did before conditions.
            share = self.condition.probability if self.condition.is_conditioned else 0.0
            conditioned = (torch.rand(x0.shape[0], generator=generator) < share).tolist()
            given = self.condition.clean_latent_frames(self.media, timing.get("temporal_factor", 1)) if any(conditioned) else 0
            clean = [given if c else 0 for c in conditioned]
            if any(clean):  # the given leading latent frames are the clean clip's own
                held = torch.tensor(clean, dtype=torch.bool, device=x0.device)[:, None, None, None, None]
                leading = torch.zeros_like(x0, dtype=torch.bool)
                leading[:, :, :given] = True
                x_t = torch.where(held & leading, x0, x_t)
            extra["first_frame_conditioned"] = sum(map(bool, clean)) / len(clean)
        v = velocity(self.module, x_t, t, ids, clean_frames=clean or 0, **timing)
        return flow_matching_loss(v, x0, eps, clean or None), extra

    def _vae_loss(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        decoded, clip = reconstruction(self.module, images, clamped=not self.rl.unclamped_loss)  # [B, 3, F, H, W] in the VAE's range
        by_classes = bool(self.rl.pixel_weights.suite)
        if self.rl.foreground_weight == 1.0 and not by_classes:
            return reconstruction_loss(decoded, clip), {}
        weights = foreground_weights(clip, self.rl.foreground_weight)
        if by_classes:
            truth, seen = clip_classes(self.pixel_classes, clip), clip_classes(self.pixel_classes, decoded)
            weights = class_weights(weights, truth, seen, self.class_ids, self.rl.pixel_weights.miss)
        # The weighted loss trains; train/mse (plain) is what train/psnr reports.
        loss = weighted_mse(decoded, clip, weights)
        return loss, {"mse": float(reconstruction_loss(decoded.detach(), clip))}

    def _grads_mean(self) -> None:
        """The replicated VAE's gradients averaged over the ranks, in place (FSDP2 does the transformer's)."""
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= self.world

    def train_step(self, step: int) -> dict[str, float]:
        """Optimizer step `step` (= self.step + 1); returns the rank-averaged train/ metrics."""
        self._next(step)
        started = time.perf_counter()
        images, captions, actions = self._images()
        self.optimizer.zero_grad(set_to_none=True)
        if self.train_vae:
            loss, extra = self._vae_loss(images)
        elif actions is not None:
            loss, extra = self._world_loss(images, captions, actions)
        else:
            loss, extra = self._flow_loss(images, captions)
        loss.backward()
        if self.train_vae and self.distributed:  # the VAE is replicated, not FSDP-sharded
            self._grads_mean()
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        self.step += 1

        names = ["loss", *extra]
        reduced = self._all_mean(torch.tensor([float(loss.detach()), *extra.values()], dtype=torch.float64))
        out = {f"train/{k}": float(v) for k, v in zip(names, reduced)}
        if self.train_vae:
            out["train/psnr"] = psnr_db(out.get("train/mse", out["train/loss"]))
        out["train/grad_norm"] = float(grad_norm)
        out["train/lr"] = lr
        out["train/samples_per_s"] = self.rl.samples_per_step / max(time.perf_counter() - started, 1e-9)
        return out
