"""The Flow-GRPO rank trainer: the online step (`trainers/online.py`) with GRPO's rollout sampler
and training half (the math: `algorithms/grpo.py`, `algorithms/grpo_sampler.py`, docs/grpo.md).

Rollout (`sample`): the SDE sampler `grpo_sampler.sample_sde` (rl.scheduler's step: Flow-GRPO's
Euler-Maruyama `sde` or the coefficients-preserving `cps`) over the packed velocity with native
guidance (v_uncond + g * (v_cond - v_uncond), as `models.sampling` guides), on the model's own
sigmas with sigma 0 appended (`models.sampling.sampler_sigmas`), sampled by the policy itself.
Each SDE step's record (x, x_next and the sampling policy's log-prob of x_next) stays in memory
until `learn` of the same step: the step's replay, never kept across steps.

Learn: group-relative advantages (`grpo.grpo_advantages`, the run's reward combination), then for
each trained step of each own sample the policy's step mean (and the frozen reference's, adapters
off, when the KL is weighed or logged), the log-prob of the recorded x_next, its ratio to the
recorded one, `grpo.grpo_step_loss`; one backward per trained step (the gradients accumulate, so
one step's graph is alive at a time) and one optimizer step per run step, or one per slice of the
step's prompts with rl.updates_per_step > 1.

On-policy by default: the old policy is the policy that sampled the step, and the step makes one
update, so the ratio is 1 to float rounding and the clip is a guard, not a brake (docs/grpo.md,
"How a run works"). With rl.updates_per_step = u the first slice is on-policy and the later ones are
trained by the moved policy against the recorded log-probs, where the clip acts. Nothing beyond
OnlineTrainer's components (and the moving average, below) needs checkpointing: a resumed step
samples again.

The moving average (rl.ema_decay > 0): a second LoRA adapter, `ema`, starts as the policy and after
every rl.ema_every-th run step (after its last update) becomes decay * ema + (1 - decay) * policy. Rollouts and
training never use it; it is the run's model (`[rl.eval]` samples it, and `cosmos-rl eval`,
`export` and `pairs mine` read the checkpoint's `ema` component), checkpointed for exact resume.

Clips (docs/grpo.md, "GRPO on clips"): text to video rolls out and trains exactly as images, over
every latent frame, each forward at the clips' time positions (`OnlineTrainer.sample_velocity`).
A conditioned run ([model.condition]: image to video, forward dynamics) hands `sample` the rows'
given leading latent frames (and action rows): the sampler holds them clean through every step,
every forward is told they are clean, and the log-probs, ratios, KL and loss read the generated
latent frames only (`grpo.step_log_prob`'s clean_frames), so the given frames train nothing.

Seeds: the initial noise is OnlineTrainer's (`rl.rollout_seed_clock`); the SDE steps' noise comes
from a generator of (job.seed, rank, step), the fast variant's window start from one of
(job.seed, step), the same on every rank, so every rank trains the same number of steps (FSDP's
collectives need that) at the same sigmas.

Context parallelism (`grid.context_parallel` = N > 1, docs/long_clips.md): `rank` here is the
data-parallel rank (`online_collectives.RankCollectives`), so the N ranks of a context group draw
the same SDE noise and initial noise, their sharded forwards give each of them the whole velocity,
hence the same records, log-probs and loss; the moving average blends the same adapters on each.
"""

from __future__ import annotations

import torch

from cosmos_rl.algorithms import grpo as grpo_math
from cosmos_rl.algorithms import grpo_sampler
from cosmos_rl.core import schema
from cosmos_rl.core.seeds import derive_seed
from cosmos_rl.trainers.online import EMA, POLICY, OnlineTrainer

__all__ = ["GRPOTrainer", "METRIC_NAMES", "guided_velocity"]

METRIC_NAMES = (
    "train/reward_mean", "train/reward_std", "train/loss", "train/policy_loss", "train/ratio_mean",
    "train/clip_fraction", "train/approx_kl", "train/grad_norm", "train/advantage_mean", "train/advantage_abs_mean",
    "time/rollout_s", "time/reward_s", "time/train_s",
)  # fmt: skip


def guided_velocity(transformer, prompt_ids, guidance: float, x: torch.Tensor, sigma: torch.Tensor, forward=None,
                    actions: torch.Tensor | None = None) -> torch.Tensor:
    """The guided velocity [B, ...] (float32) at latents x [B, ...] and sigmas [B], as the UniPC
    sampler guides: guidance 1 is the conditional branch alone, else both branches in one packed
    forward and v = v_uncond + g * (v_cond - v_uncond). prompt_ids: (cond, uncond), B each.
    forward(transformer, x, sigma, ids[, actions=]): the packed forward (default: the plain one;
    a run's own is `OnlineTrainer.sample_velocity`, which holds a condition's frames clean);
    actions [B, chunk, action_dim] (forward dynamics) go with both branches."""
    if forward is None:
        from cosmos_rl.models.packing import velocity as forward

    given = {} if actions is None else {"actions": actions}
    cond, uncond = prompt_ids
    if guidance == 1.0:
        return forward(transformer, x, sigma, cond, **given).float()
    if actions is not None:
        given = {"actions": torch.cat([actions, actions])}
    both = forward(transformer, torch.cat([x, x]), torch.cat([sigma, sigma]), list(cond) + list(uncond), **given)
    v_cond, v_uncond = both.float().chunk(2)
    return v_uncond + guidance * (v_cond - v_uncond)


class GRPOTrainer(OnlineTrainer):
    """One process's share of a GRPO run (the online state and step: OnlineTrainer)."""

    progress_fields = ("train/reward_mean", "train/policy_loss")

    def __init__(self, config, run_dir, device, comm, score):
        if not isinstance(config.rl, schema.GRPOConfig):
            raise TypeError("GRPOTrainer needs a GRPO config")
        super().__init__(config, run_dir, device, comm, score)
        # rank -> (prompt ids, SDE step records) of the step being trained: set by sample, taken by learn
        self.replay: dict[int, tuple[tuple[list, list], list[grpo_sampler.SDEStepRecord]]] = {}

    # ----------------------------------------------------------------- the moving average
    def adapter_names(self) -> tuple[str, ...]:
        return (*super().adapter_names(), EMA) if self.rl.ema_decay else super().adapter_names()

    def model_adapter(self) -> str:
        return EMA if self.rl.ema_decay else POLICY

    def _components(self):
        from cosmos_rl.checkpoint import layout
        from cosmos_rl.checkpoint.policy import AdapterState

        components = super()._components()
        if self.rl.ema_decay:
            components[layout.EMA] = AdapterState(self.transformer, EMA)
        return components

    # ----------------------------------------------------------------- which steps
    def sde_steps(self, step: int) -> list[int]:
        """The sampler steps that are SDE steps in `step`'s rollouts (the same on every rank)."""
        rl = self.rl
        if not rl.sde_window:
            return grpo_sampler.default_sde_steps(rl.sample_steps)
        gen = torch.Generator().manual_seed(derive_seed(self.config.job.seed, "grpo-window", step))
        window_range = tuple(rl.sde_window_range) if rl.sde_window_range else None
        start = grpo_sampler.draw_window_start(rl.sample_steps, rl.sde_window, gen, window_range)
        return grpo_sampler.sde_window(rl.sample_steps, rl.sde_window, start)

    def trained_steps(self, sde_steps: list[int]) -> list[int]:
        """Of a rollout's SDE steps, those that train: plain, the first floor(fraction * N); fast, all."""
        rl = self.rl
        if rl.sde_window:
            return list(sde_steps)
        return grpo_sampler.train_steps(rl.sample_steps, rl.timestep_fraction)

    # ----------------------------------------------------------------- rollout
    def noise_rank(self, rank: int) -> int:
        # One initial noise for the whole group: its ODE steps before the window are then one path,
        # and the group's rewards differ only through the SDE steps, the actions that train.
        return 0 if self.rl.same_initial_noise else rank

    def sample(self, step, rank, noise, prompt_ids, settings, condition=None, actions=None):
        from functools import partial

        from cosmos_rl.models.generate import decode_pixels
        from cosmos_rl.models.sampling import sampler_sigmas

        sigmas = sampler_sigmas(settings.steps, settings.shift, self.model.parts, self.device)
        gen = torch.Generator(device=self.device).manual_seed(derive_seed(self.config.job.seed, "grpo-sde", rank, step))
        # A conditioned clip's given leading latent frames (I2V's frame 0, a world model's frame 0
        # beside its clean action rows): clean in every forward, held by the sampler, in no log-prob.
        clean = 0 if condition is None else int(condition.shape[2])
        forward = partial(self.sample_velocity, clean=clean)
        x0, records = grpo_sampler.sample_sde(
            lambda x, sigma: guided_velocity(self.transformer, prompt_ids, settings.guidance, x, sigma, forward, actions),
            noise, sigmas, self.rl.noise_level, gen, self.sde_steps(step), self.rl.scheduler, condition=condition,
        )
        self.replay[rank] = (prompt_ids, records)
        return x0, sigmas[:-1], decode_pixels(self.model.vae, self.media, x0)

    # ----------------------------------------------------------------- learn
    def learn(self, step, rollouts, tables, cond, condition=None, actions=None):
        from cosmos_rl.dist.fsdp import gathered_while_training
        from cosmos_rl.models.setup import optimizer_step

        rl, ranks = self.rl, self.comm.ranks
        advantages = grpo_math.grpo_advantages(
            tables, self.reward_weights, rl.reward_combine, std_scope=rl.advantage_std_scope, clip_max=rl.advantage_clip
        )
        replay = [self.replay.pop(rank) for rank in ranks]
        # With kl_beta = 0 the KL is measured only on logged steps (one no-grad reference forward
        # more there), so train/kl is never a number that was not computed.
        measure_kl = rl.kl_beta > 0 or step % self.config.job.log_every == 0 or step == rl.max_steps
        # Every played rank trains the same steps; the loss is the mean over them and over the
        # played ranks (FSDP averages over ranks), so one process playing G ranks takes the step G
        # processes take.
        share = 1.0 / len(ranks)
        chosen_by_rank = []
        for prompt_ids, records in replay:
            trained = set(self.trained_steps([r.index for r in records]))
            chosen = [r for r in records if r.index in trained]
            assert chosen and len(chosen) == len(trained), (sorted(trained), [r.index for r in records])
            chosen_by_rank.append(chosen)
        # rl.updates_per_step slices every rank's samples by prompt (the same rows on every rank, so
        # a slice holds whole groups); each slice takes its own optimizer step, and from the second
        # on the policy is no longer the one that sampled: the ratio moves and the clip acts.
        (cond_ids, _), _ = replay[0]
        slices = grpo_math.update_slices(len(cond_ids), rl.updates_per_step)
        per_rank = [{} for _ in ranks]
        norms = []
        for rows in slices:
            self.optimizer.zero_grad(set_to_none=True)
            with gathered_while_training(self.transformer):
                for i, (rank, (prompt_ids, _), chosen) in enumerate(zip(ranks, replay, chosen_by_rank)):
                    ids = tuple(branch[rows] for branch in prompt_ids)  # (cond, uncond) lists of token tensors
                    adv = advantages[rows, rank].to(device=self.device, dtype=torch.float32)
                    chunks = None if actions is None else actions[rows]
                    for record in chosen:
                        loss, metrics = self._step_loss(record.rows(rows), ids, adv, measure_kl, chunks)
                        (loss * (share / len(chosen))).backward()
                        for key, value in metrics.items():
                            per_rank[i][key] = per_rank[i].get(key, 0.0) + float(value) / (len(chosen) * len(slices))
            norm, _ = optimizer_step(self.model.trainable_parameters(), self.optimizer, self.schedule, rl.optimizer.grad_clip)
            norms.append(float(norm))
        norm = sum(norms) / len(norms)
        if rl.ema_decay and step % rl.ema_every == 0:
            from cosmos_rl.models import lora

            # Warm-up (Flow-GRPO's EMA wrapper): t = the optimizer steps taken so far, this step's included.
            decay = grpo_math.ema_warmup_decay(step * rl.updates_per_step, rl.ema_decay) if rl.ema_warmup else rl.ema_decay
            lora.blend_adapter(self.transformer, EMA, POLICY, decay)
        extra = {
            "train/advantage_mean": float(advantages.mean()),
            # near the clamp bound = the advantages are pinned there (rewards too spread for the range)
            "train/advantage_abs_mean": float(advantages.abs().mean()),
        }
        return [{**m, "grad_norm": float(norm)} for m in per_rank], extra

    def _step_loss(self, record: grpo_sampler.SDEStepRecord, prompt_ids, advantages: torch.Tensor, measure_kl: bool,
                   actions: torch.Tensor | None = None):
        """One trained step of this rank's samples: (loss with grad, metrics); `kl_loss` is named `kl`
        (the KL of the two step Gaussians in rl.kl_form's scaling; NFT's `kl_loss` is a velocity MSE).
        A conditioned clip's given latent frames (record.clean_frames) are clean in the forwards, as
        the rollout held them, and left out of the log-prob and the KL (so of the ratio and the loss);
        actions: the samples' clean action rows (forward dynamics), as the rollout had them."""
        from functools import partial

        rl = self.rl
        x, s, s_next, clean = record.x, record.sigma, record.sigma_next, record.clean_frames
        sigma = s.expand(x.shape[0])
        forward = partial(self.sample_velocity, clean=clean)
        mean_ref = None
        if measure_kl:
            with torch.no_grad(), self.model.reference() as ref:
                v_ref = guided_velocity(ref, prompt_ids, rl.guidance, x, sigma, forward, actions)
                mean_ref, _ = grpo_math.step_mean_std(rl.scheduler, x, v_ref, s, s_next, rl.noise_level)
        v = guided_velocity(self.transformer, prompt_ids, rl.guidance, x, sigma, forward, actions)
        mean, std = grpo_math.step_mean_std(rl.scheduler, x, v, s, s_next, rl.noise_level)
        logp = grpo_math.step_log_prob(record.x_next, mean, std, clean)
        kl = None if mean_ref is None else grpo_math.step_kl(mean, mean_ref, std, s, s_next, rl.kl_form, rl.scheduler, clean)
        loss, metrics = grpo_math.grpo_step_loss(logp, record.log_prob, advantages, kl, rl.clip_range, rl.kl_beta, rl.clip_range_high)
        if "kl_loss" in metrics:
            metrics["kl"] = metrics.pop("kl_loss")
        return loss, metrics
