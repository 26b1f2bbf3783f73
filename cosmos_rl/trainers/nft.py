"""The DiffusionNFT step: rollout, reward, advantages, training, old-policy refresh.

Every model rank holds the whole (FSDP2-sharded) network with two LoRA adapters, "policy" (trained)
and "old" (the moving old policy, used for rollouts and v_old); adapters disabled give the frozen
reference. Per step every rank walks the same prompt rows and makes ONE sample per row, so a
prompt's group is the row's samples across the ranks (group_size = world size).

`NFTTrainer` is one process's share of that work. In a run, each Ray actor (`NFTWorker`) holds one
and plays one rank; the ranks meet through `RankCollectives` (gloo/NCCL). For fast tests,
`trainers.nft_local` builds one trainer that plays every rank of a group in one process
(`LocalCollectives`) and gives the same numbers; no manifest reaches it (the spec's
one-sample-per-rank rule stands for runs).

Reward: each rank scores its own images (the service sees group_size concurrent requests; no rank
waits on another rank's decoding), then one all_gather gives every rank the [rows, group_size]
reward table, so every rank computes the same advantages.

Determinism: every random draw comes from a generator seeded by a hash of (job.seed, purpose,
rank, counter): rollout noise from the source-row counter (`rollout_seed_clock = "source_row"`:
the n-th prompt row the run visits) or the optimizer step (`"optimizer_step"`), training
timesteps and noise from the step. A rerun therefore reproduces every sample, and a resumed run
continues exactly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from cosmos_rl import plan
from cosmos_rl.algorithms import nft as nft_math
from cosmos_rl.algorithms.multi_reward import combined_advantages, reward_metrics, weighted_reward
from cosmos_rl.checkpoint import CheckpointManager, LRScheduleState, OptimizerState, PlainState, RngStreams, layout
from cosmos_rl.checkpoint.policy import AdapterState, policy_component
from cosmos_rl.config import schema
from cosmos_rl.dist.ray_group import RankActor
from cosmos_rl.errors import RewardUnavailable
from cosmos_rl.rewards.multi import reward_terms
from cosmos_rl.seeds import derive_seed
from cosmos_rl.trainers.nft_collectives import LocalCollectives, RankCollectives
from cosmos_rl.trainers.nft_state import SEED_CONTRACT_KEY

POLICY, OLD = "policy", "old"  # the two LoRA adapter names
# What a rank's train_step returns when another rank's reward call failed for good (see train_step).
REWARD_FAILED = "reward_failed"

# (rank, uint8 images [rows, H, W, 3], prompts) -> {reward name: one score per image}
ScoreFn = Callable[[int, np.ndarray, Sequence[str]], dict[str, list[float]]]

__all__ = ["NFTTrainer", "NFTWorker", "LocalCollectives", "RankCollectives", "rollout_noise"]


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def rollout_noise(
    rl: schema.NFTConfig, job_seed: int, rank: int, step: int, latent_shape: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """Rank `rank`'s initial noise for the rows of `step` (1-based); see the module docstring for the clock."""
    rows = rl.prompts_per_step
    if rl.rollout_seed_clock == "source_row":
        first = (step - 1) * rows  # rows visited before this step
        return torch.cat([
            torch.randn(1, *latent_shape, generator=_generator(derive_seed(job_seed, "rollout-row", rank, first + j), device), device=device)
            for j in range(rows)
        ])
    gen = _generator(derive_seed(job_seed, "rollout-step", rank, step), device)
    return torch.randn(rows, *latent_shape, generator=gen, device=device)


class NFTTrainer:
    """The NFT state of one process (model, adapters, optimizer, prompts, checkpoints) and its step.

    It plays the ranks `comm.ranks`: one in a Ray run, all of a group in `trainers.nft_local`.
    """

    def __init__(self, config: schema.RunConfig, run_dir: Path, device: torch.device, comm, score: ScoreFn):
        self.config, self.rl = config, config.rl
        self.run_dir = Path(run_dir)
        self.device, self.comm, self.score = device, comm, score
        self.reward_weights = {term.name: term.weight for term in reward_terms(config.rl)}

    # ----------------------------------------------------------------- build / resume
    def build(self, resume: bool) -> int:
        """Model, optimizer, prompts; on resume load the newest checkpoint. Returns the step."""
        from cosmos_rl.data.prompts import PromptCursor, run_prompts
        from cosmos_rl.models import lora
        from cosmos_rl.models.setup import build_optimizer, build_trainable

        rl, config = self.rl, self.config
        names = (POLICY, OLD) if rl.old.build_old else (POLICY,)
        self.model = build_trainable(config, self.device, adapter_names=names)
        self.transformer = self.model.transformer
        if rl.old.build_old:
            lora.copy_adapter(self.transformer, POLICY, OLD)  # the old policy starts as the policy, exactly
        self._activate(POLICY)
        self.optimizer, self.schedule = build_optimizer(self.model.trainable_parameters(), rl.optimizer)

        self.prompts = run_prompts(rl)
        self.cursor = PromptCursor(len(self.prompts), rl.prompts_per_step, config.job.seed, rl.prompts.shuffle)
        self._token_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        vae_cfg = self.model.vae.config
        side = config.model.image_size // int(vae_cfg.scale_factor_spatial)
        self.latent_shape = (int(self.transformer.config.latent_channel), side, side)

        self.evaluator = None
        if rl.eval.every:  # [rl.eval]: built now, so a bad evaluation prompt stops the run before step 1
            from cosmos_rl.evaluation.evaluator import Evaluator

            self.evaluator = Evaluator.for_run(config, self.model, self.device)

        self.seed_contract = plan.seed_contract(config)
        self.progress = {"step": 0}
        self.checkpoints = CheckpointManager(
            self.run_dir, config.checkpoint.keep, run_identity=plan.run_identity(config), algorithm="nft"
        )
        if not resume:
            return 0
        # The caller has refused a changed seed contract (nft_state.check_seed_contract) before
        # anything was built; here the newest loadable checkpoint is loaded (damaged newer ones are
        # warned about and set aside, never deleted).
        step, _ = self.checkpoints.resume_latest(self._components())
        assert self.progress["step"] == step, f"checkpoint step_{step} records step {self.progress['step']}"
        return step

    def _components(self) -> dict[str, Any]:
        components: dict[str, Any] = {
            layout.POLICY: policy_component(self.model.state_module(), lora=self.model.lora),
            layout.OPTIMIZER: OptimizerState(self.transformer, self.optimizer),
            layout.LR_SCHEDULE: LRScheduleState(self.schedule),
            layout.DATA_CURSOR: _CursorState(self.cursor),
            layout.PROGRESS: PlainState(self.progress),
            layout.RNG: RngStreams(),
        }
        if self.rl.old.build_old:
            components[layout.OLD] = AdapterState(self.transformer, OLD)
        return components

    def save(self, step: int) -> str:
        self.progress["step"] = step
        path = self.checkpoints.save(step, self._components(), extra_meta={SEED_CONTRACT_KEY: self.seed_contract})
        return str(path)

    # ----------------------------------------------------------------- helpers
    def _activate(self, name: str) -> None:
        """Run forwards with adapter `name` while only the policy adapter stays trainable.

        peft's set_adapter also flips requires_grad; FSDP2 built its gradient plan from the
        policy-trainable state, so that is put back at once.
        """
        from cosmos_rl.models import lora

        if not self.model.lora:  # a full fine-tune has one network and no old policy (preflight)
            assert name == POLICY, name
            return
        lora.set_active(self.transformer, name)
        if name != POLICY:
            for param in lora.adapter_tensors(self.transformer, name).values():
                param.requires_grad_(False)
            for param in lora.adapter_tensors(self.transformer, POLICY).values():
                param.requires_grad_(True)

    def _tokens(self, rows: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        from cosmos_rl.models.text import model_prompt_ids

        size, template = self.config.model.image_size, self.model.parts.prompt_template
        for row in rows:
            if row not in self._token_cache:
                cond, uncond = model_prompt_ids(self.model.tokenizer, template, [self.prompts[row]], size)
                self._token_cache[row] = (cond[0].to(self.device), uncond[0].to(self.device))
        return [self._token_cache[r][0] for r in rows], [self._token_cache[r][1] for r in rows]

    # ----------------------------------------------------------------- the step
    def train_step(self, step: int) -> dict[str, float]:
        """Rollout, reward, advantages, one optimizer step and the old-policy refresh for `step` (1-based).

        If the reward service fails for good on any rank, every rank puts its prompt cursor back
        and stops before training: the rank(s) that failed raise `RewardUnavailable`, the others
        return `{REWARD_FAILED: 1}`. Nothing else of the step has changed state (rollout draws come
        from their own generators), so the caller can still commit step - 1 exactly.
        """
        from cosmos_rl.data.images import save_image_grid
        from cosmos_rl.dist.fsdp import gathered_while_sampling
        from cosmos_rl.models import lora
        from cosmos_rl.models.packing import velocity
        from cosmos_rl.models.sampling import sample_latents
        from cosmos_rl.models.vae import decode_latents
        from cosmos_rl.rewards.functions import to_uint8

        rl, ranks = self.rl, self.comm.ranks
        cursor_before = self.cursor.state_dict()
        batch = self.cursor.next_batch(self.prompts)
        rows = [row for row, _ in batch]
        texts = [text for _, text in batch]
        cond, uncond = self._tokens(rows)

        # -- rollout with the old policy: one sample per row for each rank this process plays
        t0 = time.perf_counter()
        self._activate(OLD if rl.old.build_old else POLICY)
        rollouts = []
        with torch.no_grad(), gathered_while_sampling(self.transformer):
            for rank in ranks:
                noise = rollout_noise(rl, self.config.job.seed, rank, step, self.latent_shape, self.device)
                x0, sigmas = sample_latents(
                    lambda x, s, ids: velocity(self.transformer, x, s, ids),
                    noise, cond, uncond, rl.sample_steps, rl.sampler_shift, rl.guidance,
                    parts=self.model.parts,  # the model's own scheduler; rl.sampler_shift None keeps its shift
                )
                rollouts.append((x0, sigmas, decode_latents(self.model.vae, x0)))
        self._activate(POLICY)
        t1 = time.perf_counter()

        # -- reward: own images, then everyone's
        own, failures = [], {}
        names = sorted(self.reward_weights)
        for rank, (_, _, images) in zip(ranks, rollouts):
            pixels = to_uint8(images.permute(0, 2, 3, 1).cpu().numpy())
            try:
                by_name = self.score(rank, pixels, texts)
                scores = [by_name[name] for name in names]
            except RewardUnavailable as exc:
                # Not raised here: the other ranks are about to wait in the gather. NaN (never a
                # score: the client admits finite numbers only) tells every rank at once.
                failures[rank], scores = str(exc), [[float("nan")] * len(texts) for _ in names]
            own.append(torch.tensor(scores, dtype=torch.float64, device=self.device))  # [rewards, rows]
        everyone = self.comm.gather(own).cpu()  # [G, rewards, rows]
        if torch.isnan(everyone).any():
            self.cursor.load_state_dict(cursor_before)  # nothing of this step happened
            if failures:
                raise RewardUnavailable(next(iter(failures.values())))
            return {REWARD_FAILED: 1.0}  # another rank raises the reason; this one only stops
        tables = {name: everyone[:, k, :].T for k, name in enumerate(names)}  # each [rows, G]
        rewards = weighted_reward(tables, self.reward_weights)
        t2 = time.perf_counter()

        advantages = nft_math.clamp_advantages(
            combined_advantages(tables, self.reward_weights, rl.reward_combine, std_scope=rl.advantage_std_scope),
            rl.advantage_low, rl.advantage_high,
        )
        r_all = nft_math.optimality(advantages, rl.r_map, rl.advantage_low, rl.advantage_high, rl.r_tau)

        # -- train on this process's samples with the forward process
        samples = [(rank, x0, sigmas, r_all[:, rank].to(torch.float32)) for rank, (x0, sigmas, _) in zip(ranks, rollouts)]
        train_metrics = self._train(step, samples, cond)
        if rl.old.build_old and step % rl.old.update_every == 0:
            keep = nft_math.old_decay(step, rl.old.decay_cap, rl.old.decay_rate)
            lora.blend_adapter(self.transformer, OLD, POLICY, keep)
        t3 = time.perf_counter()

        if rl.sample_grid_every and step % rl.sample_grid_every == 0:
            everyone = self.comm.gather([images.contiguous() for _, _, images in rollouts])  # [G, rows, 3, H, W]
            if 0 in ranks:
                grid = everyone.transpose(0, 1).reshape(-1, *everyone.shape[2:])  # row-major: one prompt per line
                save_image_grid(grid, self.run_dir / "samples" / f"step_{step}.png", nrow=self.comm.world_size)

        timings = {"time/rollout_s": t1 - t0, "time/reward_s": t2 - t1, "time/train_s": t3 - t2}
        metrics = self.comm.mean([{**{f"train/{k}": v for k, v in m.items()}, **timings} for m in train_metrics])
        metrics["train/reward_mean"] = float(rewards.mean())
        metrics["train/reward_std"] = float(rewards.std(unbiased=False))
        if rl.rewards:  # several rewards: each one's own mean and std too
            metrics.update(reward_metrics(tables))
        metrics["train/advantage_mean"] = float(advantages.mean())
        # near the clamp bound = the advantages are pinned there (rewards too spread for the range)
        metrics["train/advantage_abs_mean"] = float(advantages.abs().mean())
        return metrics

    # ----------------------------------------------------------------- [rl.eval]
    def evaluate(self, step: int) -> dict[str, float]:
        """The policy on the `[rl.eval]` items, split over the ranks; the group's `eval/` metrics on every rank."""
        from cosmos_rl.evaluation.evaluator import evaluate_ranks

        self._activate(POLICY)
        return evaluate_ranks(self.evaluator, self.transformer, self.comm.ranks, self.comm.world_size, self.comm.mean)

    def _training_inputs(self, step: int, rank: int, x0: torch.Tensor, sigmas: torch.Tensor, cond: list[torch.Tensor], r: torch.Tensor):
        """Rank `rank`'s training batch: its samples noised at the training timesteps (drawn from
        a generator of (job.seed, rank, step)), the velocity target and each row's optimality."""
        from cosmos_rl.flow import noisy_latents, uniform_timesteps, velocity_target

        rl = self.rl
        gen = _generator(derive_seed(self.config.job.seed, "train", rank, step), self.device)
        rows = x0.shape[0]
        if rl.uniform_timestep:
            per_sample = rl.timesteps_per_sample or max(rl.sample_steps - 1, 1)
            t = uniform_timesteps(rows * per_sample, gen, device=self.device)
        else:
            picks = nft_math.timestep_picks(sigmas.numel(), rows, rl.timesteps_per_sample, gen, device=self.device)
            per_sample = picks.shape[1]
            t = sigmas[picks.flatten()]
        x0_rep = x0.repeat_interleave(per_sample, dim=0)
        ids = [ids for ids in cond for _ in range(per_sample)]
        r_rep = r.to(self.device).repeat_interleave(per_sample)
        eps = torch.randn(x0_rep.shape, generator=gen, device=self.device, dtype=x0_rep.dtype)
        return noisy_latents(x0_rep, eps, t), t, ids, velocity_target(x0_rep, eps), r_rep

    def _rank_loss(self, measure_kl: bool, x_t, t, ids, target, r_rep):
        from cosmos_rl.models.packing import velocity

        rl = self.rl
        with torch.no_grad():
            v_old = None
            if rl.old.build_old:
                self._activate(OLD)
                v_old = velocity(self.transformer, x_t, t, ids)
                self._activate(POLICY)
            v_ref = None
            if rl.kl_beta or measure_kl:
                with self.model.reference() as ref:
                    v_ref = velocity(ref, x_t, t, ids)
        v_theta = velocity(self.transformer, x_t, t, ids)
        if v_old is None:
            v_old = v_theta.detach()
        return nft_math.nft_loss(
            v_theta, v_old, v_ref, target, r_rep,
            rl.beta, rl.policy_loss_scale, rl.kl_beta, x0_weighting_t=t if rl.x0_weighting else None,
        )

    def _train(self, step: int, samples: list, cond: list[torch.Tensor]) -> list[dict[str, float]]:
        """One optimizer step on every played rank's samples; one metrics dict per played rank.

        The loss is the mean of the played ranks' losses: FSDP averages gradients over ranks, so a
        process playing all G ranks takes the same step as G processes playing one each.
        """
        # With kl_beta = 0 the KL is measured only on the steps whose metrics are logged (one
        # no-grad reference forward more there), so train/kl_loss is never a number not computed.
        job = self.config.job
        measure_kl = step % job.log_every == 0 or step == self.rl.max_steps
        losses, metrics = [], []
        for rank, x0, sigmas, r in samples:
            loss, rank_metrics = self._rank_loss(measure_kl, *self._training_inputs(step, rank, x0, sigmas, cond, r))
            losses.append(loss)
            metrics.append(rank_metrics)
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        from cosmos_rl.models.setup import optimizer_step

        norm, _ = optimizer_step(self.model.trainable_parameters(), self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        out = []
        for rank_metrics in metrics:
            row = {k: float(v) for k, v in rank_metrics.items() if k != "loss"}
            row["loss"] = float(rank_metrics["loss"])
            row["grad_norm"] = float(norm)
            out.append(row)
        return out


class NFTWorker(RankActor):
    """The Ray actor of one rank. The driver calls pick_port (rank 0), setup_world, build, train_step, save, evaluate."""

    def __init__(self, rank: int, world_size: int, config: schema.RunConfig, run_dir: str,
                 reward_urls: dict[str, str], reward_tokens: dict[str, str | None]):
        self._init_rank(rank, world_size, config)
        self.run_dir, self.reward_urls, self.reward_tokens = Path(run_dir), reward_urls, reward_tokens

    def build(self, resume: bool) -> int:
        from cosmos_rl.rewards.multi import MultiRewardClient

        client = MultiRewardClient.from_config(self.config.rl, self.reward_urls, self.reward_tokens)
        self.trainer = NFTTrainer(
            self.config, self.run_dir, self.device, RankCollectives(self.rank, self.world_size, self.device),
            _scored_by(client),
        )
        return self.trainer.build(resume)

    def train_step(self, step: int) -> dict[str, float]:
        return self.trainer.train_step(step)

    def save(self, step: int) -> str:
        return self.trainer.save(step)

    def evaluate(self, step: int) -> dict[str, float]:
        return self.trainer.evaluate(step)

    def shutdown(self) -> None:
        from cosmos_rl.dist.world import process_group_active

        if process_group_active():
            import torch.distributed as dist

            dist.destroy_process_group()


def _scored_by(client) -> ScoreFn:
    from cosmos_rl.rewards.client import RewardServiceError

    def score(rank: int, pixels: np.ndarray, prompts: Sequence[str]) -> dict[str, list[float]]:
        try:
            return client.score(pixels, prompts)
        except RewardServiceError as exc:
            raise RewardUnavailable(f"rank {rank}: {exc}") from None  # the message names the service

    return score


class _CursorState(PlainState):
    def __init__(self, cursor):
        super().__init__()
        self.cursor = cursor

    def capture(self) -> dict[str, Any]:
        return self.cursor.state_dict()

    def restore(self, data: dict[str, Any]) -> None:
        self.cursor.load_state_dict(data)
