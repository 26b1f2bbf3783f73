"""The offline Diffusion-DPO loop: preference pairs -> shared-noise velocity MSEs -> DPO loss -> AdamW.

Runs the same in one process (tests) and under torchrun (one process per rank); the only
distributed calls are the metric all-reduce and what FSDP2/DCP do inside the model and checkpoint.
`dist/` and `trainers/spmd_worker.py` set the process group up; this module never reads launcher env.

Per step, on each rank: its share of the step's pairs (PairCursor) -> VAE latents of winners and
losers (no grad) -> one noise eps and flow time t per pair, shared by winner and loser, drawn from a
generator seeded by (job.seed, step, rank) so a resumed run redraws them exactly -> policy and
reference velocities, each in ONE packed forward over winners+losers -> per-sample MSE ->
`algorithms.dpo.dpo_loss` -> backward, gradient clipping, AdamW, LR schedule.

A checkpoint holds: policy (LoRA tensors, or all weights for a full fine-tune), optimizer, LR
schedule, step, pair cursor (when rl.data.cursor_resume) and every rank's RNG streams. The frozen
reference is rebuilt from the base at setup, so it is never saved.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cosmos_rl import plan
from cosmos_rl.algorithms.dpo import dpo_loss, per_sample_mse
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
from cosmos_rl.data.audit import leakage_audit
from cosmos_rl.data.cursor import PairCursor
from cosmos_rl.data.pairs import (
    JsonlPairs,
    SyntheticPairs,
    TarShardPairs,
    check_source_symmetry,
    factory_source,
)
from cosmos_rl.dist.world import process_group_active, rank_and_world
from cosmos_rl.errors import UserError
from cosmos_rl.flow import noisy_latents, velocity_target
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.setup import TrainableModel, build_optimizer, build_trainable, optimizer_step
from cosmos_rl.models.text import model_prompt_ids
from cosmos_rl.models.vae import encode_images
from cosmos_rl.seeds import derive_seed
from cosmos_rl.trainers.loop import LoopSpec, run_rank_steps

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


# ------------------------------------------------------------------------------------------ data
def build_source(data: schema.PreferenceDataConfig, image_size: int, job_seed: int, what: str):
    """The pair source a data section names; synthetic pairs win over any file source."""
    if data.synthetic_pairs:
        return SyntheticPairs(data.synthetic_pairs, image_size, job_seed + data.synthetic_seed)
    if data.jsonl:
        return JsonlPairs(data.jsonl, image_size)
    if data.shards:
        return TarShardPairs(list(data.shards), image_size)
    if data.factory:
        return factory_source(data.factory, **dict(data.factory_kwargs))
    raise UserError(f"{what}: no pair source; set {what}.synthetic_pairs, .jsonl, .shards or .factory")


def _latent_cache(mode: str, vae, output_dir: str):
    """The pair images' latent cache `rl.latent_cache` asks for (None: encode every step)."""
    if mode == "off":
        return None
    from cosmos_rl.models.latent_cache import LatentCache

    return LatentCache(vae, Path(output_dir) / ".cache" / "latents" if mode == "disk" else None)


# ----------------------------------------------------------------------------------------- trainer
class DPOTrainer:
    """One rank's share of a DPO run. `run()` trains to rl.max_steps; `train_step()` does one step."""

    def __init__(
        self,
        config: schema.RunConfig,
        run_dir: Path,
        device: torch.device,
        *,
        resume: bool = False,
    ):
        if not isinstance(config.rl, schema.DPOConfig):
            raise TypeError("DPOTrainer needs a DPO config")
        self.config = config
        self.rl: schema.DPOConfig = config.rl
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device = device
        self.resume = resume
        self.distributed = process_group_active()
        self.rank, self.world = rank_and_world()
        self.is_main = self.rank == 0
        self.step = 0  # optimizer steps completed

        size = config.model.image_size
        self.train_source = build_source(self.rl.data, size, config.job.seed, "rl.data")
        self.val_source = None
        if self.rl.validation.every > 0:
            self.val_source = build_source(self.rl.validation.data, size, config.job.seed, "rl.validation.data")

        self.model: TrainableModel = build_trainable(config, device)
        self.latents = _latent_cache(self.rl.latent_cache, self.model.vae, config.job.output_dir)
        self.evaluator = None
        if self.rl.eval.every:  # [rl.eval]: sampled held-out prompts scored by a reward (eval/ metrics)
            from cosmos_rl.evaluation.evaluator import Evaluator

            self.evaluator = Evaluator.for_run(config, self.model, device)
        self._ids_cache: dict[str, torch.Tensor] = {}
        self._check_data()
        self.cursor = PairCursor(
            len(self.train_source),
            self.rl.pairs_per_step,
            config.job.seed,
            self.world,
            self.rank,
            shuffle=self.rl.data.shuffle,
        )
        self.params = self.model.trainable_parameters()
        self.optimizer, self.schedule = build_optimizer(self.params, self.rl.optimizer)
        self.identity = plan.run_identity(config)
        self.checkpoints = CheckpointManager(
            self.run_dir, config.checkpoint.keep, run_identity=self.identity, algorithm="dpo"
        )
        if resume:
            self._load_latest()

    # -------------------------------------------------------------------------------- set-up
    def prompt_ids(self, prompt: str) -> torch.Tensor:
        ids = self._ids_cache.get(prompt)
        if ids is None:
            size = self.config.model.image_size
            cond, _ = model_prompt_ids(self.model.tokenizer, self.model.parts.prompt_template, [prompt], size)
            ids = self._ids_cache[prompt] = cond[0].to(self.device)
        return ids

    def _check_data(self) -> None:
        """Symmetry and leakage, from metadata only, before any step (all ranks raise together)."""
        tokenize = lambda text: self.prompt_ids(text).tolist()  # noqa: E731
        check_source_symmetry(self.train_source, tokenize)
        if self.val_source is not None:
            check_source_symmetry(self.val_source, tokenize)
            leakage_audit(self.train_source.membership_ids(), self.val_source.membership_ids())

    def _components(self, *, with_rng: bool = True) -> dict[str, Any]:
        transformer = self.model.state_module()
        components: dict[str, Any] = {
            layout.POLICY: ModelState(transformer, trainable_only=self.model.lora),
            layout.OPTIMIZER: OptimizerState(transformer, self.optimizer),
            layout.LR_SCHEDULE: LRScheduleState(self.schedule),
            layout.PROGRESS: PlainState({"step": self.step}),
        }
        if self.rl.data.cursor_resume:
            components[layout.DATA_CURSOR] = PlainState(self.cursor.state_dict())
        if with_rng:
            components[layout.RNG] = RngStreams()
        return components

    def _load_latest(self) -> None:
        """Continue from the newest loadable committed checkpoint, or fail saying why (never restart from base).

        `CheckpointManager.resume_latest` skips (with a warning naming why) a committed checkpoint
        that cannot be loaded and tries the next older one; when none loads, the run stops listing
        every reason.
        """
        # A non-exact DPO resume may change the world size; checkpoints from before the algorithm
        # was recorded are DPO's.
        self.step, components = self.checkpoints.resume_for_world(
            self.world, lambda same_world: self._components(with_rng=same_world), unmarked_ok=True
        )
        if self.rl.data.cursor_resume:
            self.cursor.load_state_dict(components[layout.DATA_CURSOR].data)

    def save(self) -> Path:
        return self.checkpoints.save(self.step, self._components())

    # -------------------------------------------------------------------------------- math
    def _pair_tensors(self, pairs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Latents [2P, C, h, w] (winners then losers) and the matching prompt ids."""
        images = torch.stack([p.winner for p in pairs] + [p.loser for p in pairs]).to(self.device)
        if self.latents is not None:
            latents = self.latents.encode(images)
        else:
            with torch.no_grad():
                latents = encode_images(self.model.vae, images)
        ids = [self.prompt_ids(p.prompt) for p in pairs]
        return latents, ids + ids

    def _objective(self, latents, ids, eps, t, *, with_grad: bool):
        """DPO loss and metrics for P pairs: latents [2P, ...], eps [P, ...], t [P] shared by both sides."""
        count = eps.shape[0]
        eps2, t2 = torch.cat([eps, eps]), torch.cat([t, t])
        x_t = noisy_latents(latents, eps2, t2)
        target = velocity_target(latents, eps2)
        with torch.no_grad(), self.model.reference() as reference:
            mse_ref = per_sample_mse(velocity(reference, x_t, t2, ids), target)
        with torch.set_grad_enabled(with_grad):
            mse = per_sample_mse(velocity(self.model.transformer, x_t, t2, ids), target)
            return dpo_loss(mse[:count], mse[count:], mse_ref[:count], mse_ref[count:], self.rl.beta)

    def _draw(self, shape, *parts) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(derive_seed(*parts))
        eps = torch.randn(shape, generator=generator)
        t = torch.rand(shape[0], generator=generator)
        return eps.to(self.device), t.to(self.device)

    def _all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the ranks, on the CPU. The collective runs on the rank's device:
        NCCL takes only CUDA tensors (gloo reduces a CPU tensor in place, the same numbers)."""
        if not self.distributed:
            return values
        on_device = values.to(self.device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.cpu()

    def _all_mean(self, values: torch.Tensor) -> torch.Tensor:
        return self._all_sum(values) / self.world if self.distributed else values

    def next_pairs(self) -> list:
        """This rank's pairs for the next step (the Ray per_role trainer fetches them from its data actor)."""
        return [self.train_source[i] for i in self.cursor.next_batch()]

    def train_step(self) -> dict[str, float]:
        """One optimizer step; returns the rank-averaged train/ metrics."""
        started = time.perf_counter()
        pairs = self.next_pairs()
        latents, ids = self._pair_tensors(pairs)
        shape = (len(pairs), *latents.shape[1:])
        eps, t = self._draw(shape, "train", self.config.job.seed, self.step, self.rank)

        self.optimizer.zero_grad(set_to_none=True)
        loss, metrics = self._objective(latents, ids, eps, t, with_grad=True)
        loss.backward()
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        self.step += 1

        reduced = self._all_mean(torch.stack([metrics[k].float() for k in LOSS_METRICS]).cpu())
        out = {f"train/{k}": float(v) for k, v in zip(LOSS_METRICS, reduced)}
        out["train/grad_norm"] = float(grad_norm)
        out["train/lr"] = lr
        out["train/pairs_per_s"] = self.rl.pairs_per_step / max(time.perf_counter() - started, 1e-9)
        return out

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """The DPO objective on up to max_pairs held-out pairs; each pair's noise is fixed by its index."""
        total = min(self.rl.validation.max_pairs, len(self.val_source))
        mine = list(range(self.rank, total, self.world))
        chunk = max(self.rl.pairs_per_step // self.world, 1)
        sums = torch.zeros(len(VAL_METRICS) + 1)
        for start in range(0, len(mine), chunk):
            indices = mine[start : start + chunk]
            latents, ids = self._pair_tensors([self.val_source[i] for i in indices])
            draws = [self._draw((1, *latents.shape[1:]), "val", self.config.job.seed, i) for i in indices]
            eps = torch.cat([d[0] for d in draws])
            t = torch.cat([d[1] for d in draws])
            _, metrics = self._objective(latents, ids, eps, t, with_grad=False)
            sums[:-1] += torch.stack([metrics[k].float().cpu() for k in VAL_METRICS]) * len(indices)
            sums[-1] += len(indices)
        sums = self._all_sum(sums)  # ranks may hold different counts: sum numerators and the count, not means
        return {f"val/{k}": float(v) for k, v in zip(VAL_METRICS, sums[:-1] / sums[-1])}

    # -------------------------------------------------------------------------------- loop
    def _holdout(self, step: int) -> dict[str, float]:
        every = self.rl.validation.every
        if self.val_source is None or every <= 0 or step % every:
            return {}
        return self.validate()

    def evaluate(self, step: int) -> dict[str, float]:
        """[rl.eval] (collective): every rank samples its share of the items, one all-reduce sums the scores."""
        from cosmos_rl.evaluation.evaluator import evaluate_all_reduce

        return evaluate_all_reduce(self.evaluator, self.model.transformer, self.rank, self.world)

    def _step(self, step: int) -> dict[str, float]:
        assert step == self.step + 1, f"the loop asked for step {step} after step {self.step}"
        return self.train_step()

    def run(self) -> list[dict[str, float]]:
        """Train to rl.max_steps, writing metrics and checkpoints; returns the rows this call wrote."""
        spec = LoopSpec(
            run_dir=self.run_dir, start_step=self.step, resumed=self.resume, main=self.is_main,
            unit="pairs", items_per_step=self.rl.pairs_per_step,
            progress_fields=("train/loss", "train/dpo_accuracy"),
        )
        return run_rank_steps(self.config, spec, self._step, lambda step: self.save(), self._holdout, self.evaluate)


def train(config: schema.RunConfig, run_dir: Path, device: torch.device, *, resume: bool) -> list[dict]:
    """Build the trainer for this rank and run it to the end."""
    return DPOTrainer(config, run_dir, device, resume=resume).run()
