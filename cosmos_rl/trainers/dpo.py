"""The offline Diffusion-DPO loop: preference pairs -> shared-noise velocity MSEs -> DPO loss -> AdamW.

Runs the same in one process (tests) and under torchrun (one process per rank); the only
distributed calls are the metric all-reduce and what FSDP2/DCP do inside the model and checkpoint.
`dist/` and `trainers/spmd_worker.py` set the process group up; this module never reads launcher env.

Per step, on each rank: its share of the step's pairs (PairCursor) -> VAE latents of winners and
losers (no grad) -> one noise eps and flow time t per pair, shared by winner and loser, drawn from a
generator seeded by (job.seed, step, rank) so a resumed run redraws them exactly -> policy and
reference velocities, each in ONE packed forward over winners+losers -> per-sample MSE ->
`algorithms.dpo.dpo_loss` -> backward, gradient clipping, AdamW, LR schedule.

A video run (`model.num_frames` > 1) trains clip pairs the same way: the sides are clips
[3, F, H, W], their latents [2P, C, T, h, w] (`models.generate.encode_pixels`, through the latent cache), and the
packed forward places each clip's (T, h, w) grid in time at `model.fps` (`frame_timing`), as SFT
does. The loss is unchanged: each side's MSE is the mean over all its latent elements, every frame
included. No frame is held clean (no image-to-video conditioning in DPO), except in forward dynamics:

A world-model run (`[model.condition] kind = "forward_dynamics"`, source an episode suite that keys
its windows, `trainers/dpo_world.py`) trains pairs of predicted futures whose prompt is a window
key (`cosmos-rl pairs mine --reward pusht_forward_partial`). Both sides get the key's frame 0 as
their clean latent frame 0 (in x_t too) and its true action rows, clean, in the same packed forward
for the policy and the reference; the text is the structured action caption of the window's task.
Each side's MSE is then the mean over the generated latent frames only: frame 0 and the action rows
are in no loss. The draws are those of text-to-video (eps covers frame 0 too and is unused there).

A checkpoint holds: policy (LoRA tensors, or all weights for a full fine-tune), optimizer, LR
schedule, step, pair cursor (when rl.data.cursor_resume) and every rank's RNG streams. The frozen
reference is rebuilt from the base at setup, so it is never saved.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse
from cosmos_rl.checkpoint import PlainState
from cosmos_rl.core import schema
from cosmos_rl.data.audit import leakage_audit
from cosmos_rl.data.cursor import PairCursor
from cosmos_rl.data.pairs import build_source, check_source_symmetry
from cosmos_rl.core.flow import noisy_latents, training_timesteps, velocity_target
from cosmos_rl.core.condition import Condition
from cosmos_rl.core.media import frame_timing
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.setup import TrainableModel, build_trainable, optimizer_step
from cosmos_rl.models.text import model_prompt_ids
from cosmos_rl.models.generate import encode_pixels
from cosmos_rl.core.seeds import derive_seed
from cosmos_rl.trainers.spmd import SPMDTrainer

log = logging.getLogger(__name__)

# Per-pair values dpo_loss reports, in the order they travel through the metric all-reduce.
LOSS_METRICS = (
    "loss",
    "dpo_accuracy",
    "dpo_reward_margin",
    "policy_mse_winner",
    "policy_mse_loser",
    "ref_mse_winner",
    "ref_mse_loser",
)
VAL_METRICS = ("loss", "dpo_accuracy", "dpo_reward_margin")


def _latent_cache(mode: str, vae, output_dir: str):
    """The pair images' latent cache `rl.latent_cache` asks for (None: encode every step)."""
    if mode == "off":
        return None
    from cosmos_rl.models.latent_cache import LatentCache

    return LatentCache(vae, Path(output_dir) / ".cache" / "latents" if mode == "disk" else None)


# ----------------------------------------------------------------------------------------- trainer
class DPOTrainer(SPMDTrainer):
    """One rank's share of a DPO run (the calls: trainers/spmd.py)."""

    unit = "pairs"
    progress_fields = ("train/loss", "train/dpo_accuracy")
    unmarked_ok = True  # checkpoints from before the algorithm was recorded are DPO's

    def setup(self) -> None:
        config = self.config
        if not isinstance(config.rl, schema.DPOConfig):
            raise TypeError("DPOTrainer needs a DPO config")
        self.train_source = build_source(self.rl.data, self.media, config.job.seed, "rl.data")
        self.val_source = None
        if self.rl.validation.every > 0:
            self.val_source = build_source(self.rl.validation.data, self.media, config.job.seed, "rl.validation.data")

        self.model: TrainableModel = build_trainable(config, self.device)
        # grid.context_parallel: the policy (and, under LoRA, the reference: adapters off) and a full
        # fine-tune's frozen reference split their vision tokens over the context group.
        self.set_context_parallel(self.model.transformer, self.model.frozen_ref)
        self.timing = frame_timing(self.media, self.model.vae.config)  # {} for images
        self.latents = _latent_cache(self.rl.latent_cache, self.model.vae, config.job.output_dir)
        if self.rl.eval.every:  # [rl.eval]: sampled held-out prompts scored by a reward (eval/ metrics)
            from cosmos_rl.evaluation.evaluator import Evaluator

            self.evaluator = Evaluator.for_run(config, self.model, self.device)
        self._ids_cache: dict[str, torch.Tensor] = {}
        # Forward dynamics: each pair's frame 0, action rows and caption rebuilt from its key (None: captions).
        self.pair_windows = None
        condition = Condition.from_model_config(config.model)
        if condition.is_conditioned:
            from cosmos_rl.trainers.dpo_world import PairWindows

            self.pair_windows = PairWindows(condition, self.media, self.model, self.device)
            self.pair_windows.check(self.train_source, "rl.data")
            if self.val_source is not None:
                self.pair_windows.check(self.val_source, "rl.validation.data")
        self._check_data()
        self.cursor = PairCursor(
            len(self.train_source),
            self.rl.pairs_per_step,
            config.job.seed,
            self.data_world,  # a context group's ranks walk one share (self.world without context parallelism)
            self.data_rank,
            shuffle=self.rl.data.shuffle,
        )
        self.module, self.lora = self.model.state_module(), self.model.lora
        self.params = self.model.trainable_parameters()

    def __init__(self, config, run_dir, device, *, resume: bool = False, data_actor=None):
        # grid.grouping = "per_role" (Ray): the pairs and the data cursor live in the data actor,
        # reached through this client; None: this rank's own source and cursor.
        self.data = None
        if data_actor is not None:
            from cosmos_rl.trainers.dpo_data_actor import DataActorClient

            self.data = DataActorClient(data_actor)
        super().__init__(config, run_dir, device, resume=resume)

    @classmethod
    def on_ray(cls, config, run_dir, device, rank, world, resume, context):
        return cls(config, run_dir, device, resume=resume, data_actor=context.get("data_actor"))

    def has_holdout(self) -> bool:
        return self.val_source is not None and self.rl.validation.every > 0

    def items_per_step(self) -> int:
        return self.rl.pairs_per_step

    def sampling_transformer(self) -> torch.nn.Module:
        return self.model.transformer

    def cursor_state(self):
        if not self.rl.data.cursor_resume:
            return None
        if self.data is not None:  # the data actor's cursor, not this rank's unused one
            return PlainState(self.data.cursor_state(self.rank))
        return super().cursor_state()

    def restore_cursor(self, components) -> None:
        super().restore_cursor(components)
        if self.data is not None:
            self.data.load_cursor(self.rank, self.cursor.state_dict())

    # -------------------------------------------------------------------------------- set-up
    def prompt_ids(self, prompt: str) -> torch.Tensor:
        """The text a pair trains under: its prompt, or in forward dynamics its key's structured action caption."""
        if self.pair_windows is not None:
            return self.pair_windows.prompt_ids(prompt)
        return self._text_ids(prompt)

    def _text_ids(self, prompt: str) -> torch.Tensor:
        ids = self._ids_cache.get(prompt)
        if ids is None:
            cond, _ = model_prompt_ids(self.model.tokenizer, self.model.parts.prompt_template, [prompt], self.media)
            ids = self._ids_cache[prompt] = cond[0].to(self.device)
        return ids

    def _check_data(self) -> None:
        """Symmetry and leakage, from metadata only, before any step (all ranks raise together)."""
        tokenize = lambda text: self._text_ids(text).tolist()  # noqa: E731 (per-side prompts against the pair's own text)
        check_source_symmetry(self.train_source, tokenize)
        if self.val_source is not None:
            check_source_symmetry(self.val_source, tokenize)
            leakage_audit(self.train_source.membership_ids(), self.val_source.membership_ids())

    # -------------------------------------------------------------------------------- math
    def _pair_tensors(self, pairs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Latents [2P, C, T, h, w] (winners then losers; T = 1 for images) and the matching prompt ids.
        Forward dynamics: both sides' leading latent frames are their key's clean frame 0."""
        pixels = torch.stack([p.winner for p in pairs] + [p.loser for p in pairs]).to(self.device)
        if self.latents is not None:
            latents = self.latents.encode(pixels)  # images or clips, by the batch's rank
        else:
            with torch.no_grad():
                latents = encode_pixels(self.model.vae, self.media, pixels)
        ids = [self.prompt_ids(p.prompt) for p in pairs]
        if self.pair_windows is not None:
            keys = [p.prompt for p in pairs] * 2
            latents = latents.clone()
            latents[:, :, : self.pair_windows.clean] = self.pair_windows.frame_latents(keys).to(latents.dtype)
        return latents, ids + ids

    def _world_inputs(self, pairs) -> dict:
        """The packed forward's conditioning keywords of winners then losers (none without a condition)."""
        if self.pair_windows is None:
            return {}
        return {"clean_frames": self.pair_windows.clean, **self.pair_windows.action_inputs([p.prompt for p in pairs] * 2)}

    def _objective(self, latents, ids, eps, t, *, with_grad: bool, given: dict | None = None):
        """DPO loss and metrics for P pairs: latents [2P, ...], eps [P, ...], t [P] shared by both sides.
        `given` (forward dynamics, `_world_inputs`): the clean leading frames and action rows both
        forwards carry; the MSEs skip those frames, and the action velocity is dropped."""
        count = eps.shape[0]
        eps2, t2 = torch.cat([eps, eps]), torch.cat([t, t])
        x_t = noisy_latents(latents, eps2, t2)
        target = velocity_target(latents, eps2)
        given = given or {}
        clean = int(given.get("clean_frames", 0))
        if clean:
            x_t[:, :, :clean] = latents[:, :, :clean]  # the condition is clean: never noised

        def forward(network):
            out = velocity(network, x_t, t2, ids, **self.timing, **given)
            v = out[0] if "actions" in given else out  # the action rows' velocity trains nothing: dropped
            return per_sample_mse(v[:, :, clean:], target[:, :, clean:])  # the generated frames alone

        with torch.no_grad(), self.model.reference() as reference:
            mse_ref = forward(reference)
        with torch.set_grad_enabled(with_grad):
            mse = forward(self.model.transformer)
            return dpo_loss(mse[:count], mse[count:], mse_ref[:count], mse_ref[count:], self.rl.beta)

    def _draw(self, shape, *parts) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(derive_seed(*parts))
        eps = torch.randn(shape, generator=generator)
        t = training_timesteps(shape[0], generator, self.rl.timestep_sampling, self.rl.logit_mean, self.rl.logit_std)
        return eps.to(self.device), t.to(self.device)

    def next_pairs(self) -> list:
        """This rank's pairs for the next step (under per_role, from the data actor)."""
        if self.data is not None:
            return self.data.next_batch(self.step + 1, self.rank)
        return [self.train_source[i] for i in self.cursor.next_batch()]

    def train_step(self, step: int) -> dict[str, float]:
        """Optimizer step `step` (= self.step + 1); returns the rank-averaged train/ metrics."""
        from cosmos_rl.dist.fsdp import gathered_while_training

        self._next(step)
        started = time.perf_counter()
        pairs = self.next_pairs()
        latents, ids = self._pair_tensors(pairs)
        shape = (len(pairs), *latents.shape[1:])
        eps, t = self._draw(shape, "train", self.config.job.seed, self.step, self.data_rank)

        self.optimizer.zero_grad(set_to_none=True)
        # The reference forward, the policy forward and the backward gather each sharded layer once.
        with gathered_while_training(self.model.transformer):
            loss, metrics = self._objective(latents, ids, eps, t, with_grad=True, given=self._world_inputs(pairs))
            loss.backward()
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        self.step += 1

        reduced = self._all_mean(torch.stack([metrics[k].float() for k in LOSS_METRICS]).cpu())
        out = {f"train/{k}": v for k, v in zip(LOSS_METRICS, reduced.tolist())}
        out["train/grad_norm"] = float(grad_norm)
        out["train/lr"] = lr
        out["train/pairs_per_s"] = self.rl.pairs_per_step / max(time.perf_counter() - started, 1e-9)
        return out

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """The DPO objective on up to max_pairs held-out pairs; each pair's noise is fixed by its index."""
        from cosmos_rl.dist.fsdp import gathered_while_sampling

        total = min(self.rl.validation.max_pairs, len(self.val_source))
        mine = list(range(self.data_rank, total, self.data_world))
        chunk = max(self.rl.pairs_per_step // self.data_world, 1)
        sums = torch.zeros(len(VAL_METRICS) + 1)
        with gathered_while_sampling(self.model.transformer):  # every chunk's two forwards, one gather
            for start in range(0, len(mine), chunk):
                indices = mine[start : start + chunk]
                chunk_pairs = [self.val_source[i] for i in indices]
                latents, ids = self._pair_tensors(chunk_pairs)
                draws = [self._draw((1, *latents.shape[1:]), "val", self.config.job.seed, i) for i in indices]
                eps = torch.cat([d[0] for d in draws])
                t = torch.cat([d[1] for d in draws])
                _, metrics = self._objective(latents, ids, eps, t, with_grad=False, given=self._world_inputs(chunk_pairs))
                sums[:-1] += torch.stack([metrics[k].float().cpu() for k in VAL_METRICS]) * len(indices)
                sums[-1] += len(indices)
        sums = self._all_sum(sums)  # ranks may hold different counts: sum numerators and the count, not means
        return {f"val/{k}": float(v) for k, v in zip(VAL_METRICS, sums[:-1] / sums[-1])}

    # -------------------------------------------------------------------------------- loop
    def holdout(self, step: int) -> dict[str, float]:
        every = self.rl.validation.every
        if self.val_source is None or every <= 0 or step % every:
            return {}
        return self.validate()
