"""One DiffusionNFT rank: the Ray actor that plays data, rollout, reward, replay and policy.

Every rank holds the whole (FSDP2-sharded) network with two LoRA adapters, "policy" (trained)
and "old" (the moving old policy, used for rollouts and v_old); adapters disabled give the frozen
reference. Per step every rank walks the same prompt rows and makes ONE sample per row, so a
prompt's group is the row's samples across the ranks (group_size = world size).

Reward: each rank scores its own images through the reward service (the service sees group_size
concurrent requests; no rank waits on another rank's decoding), then one all_gather gives every
rank the [rows, group_size] reward table, so every rank computes the same advantages.

Determinism: every random draw comes from a generator seeded by a hash of (job.seed, purpose,
rank, counter): rollout noise from the source-row counter (`rollout_seed_clock = "source_row"`:
the n-th prompt row the run visits) or the optimizer step (`"optimizer_step"`), training
timesteps and noise from the step. A rerun therefore reproduces every sample, and a resumed run
continues exactly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cosmos_rl import plan
from cosmos_rl.algorithms import nft as nft_math
from cosmos_rl.checkpoint import CheckpointManager, LRScheduleState, OptimizerState, PlainState, RngStreams, layout
from cosmos_rl.config import schema
from cosmos_rl.dist.ray_group import RankActor
from cosmos_rl.errors import UserError
from cosmos_rl.seeds import derive_seed
from cosmos_rl.trainers.nft_state import SEED_CONTRACT_KEY, AdapterState, contract_changes

POLICY, OLD = "policy", "old"


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


class NFTWorker(RankActor):
    """The actor. The driver calls pick_port (rank 0), setup_world, build, train_step, save."""

    def __init__(self, rank: int, world_size: int, config: schema.RunConfig, run_dir: str, reward_url: str):
        self._init_rank(rank, world_size, config)
        self.rl = config.rl
        self.run_dir = Path(run_dir)
        self.reward_url = reward_url

    # ----------------------------------------------------------------- build / resume
    def build(self, resume: bool) -> int:
        """Model, optimizer, prompts, reward client; on resume load the newest checkpoint. Returns the step."""
        from cosmos_rl.data.prompts import BUILTIN_PROMPTS, PromptCursor, load_prompts
        from cosmos_rl.models import lora
        from cosmos_rl.models.setup import build_optimizer, build_policy
        from cosmos_rl.rewards.client import RewardClient

        rl, config = self.rl, self.config
        if config.model.lora.rank <= 0 and rl.old.build_old:
            raise UserError(
                "model.lora.rank: NFT keeps the old policy as a second LoRA adapter; set model.lora.rank > 0 "
                "(or rl.old.build_old = false)"
            )
        names = (POLICY, OLD) if rl.old.build_old else (POLICY,)
        self.policy = build_policy(config, self.device, adapter_names=names)
        self.transformer = self.policy.transformer
        if rl.old.build_old:
            lora.copy_adapter(self.transformer, POLICY, OLD)  # the old policy starts as the policy, exactly
        self._activate(POLICY)
        self.optimizer, self.schedule = build_optimizer(self.policy.trainable_parameters(), rl.optimizer)

        self.prompts = load_prompts(rl.prompts.file) if rl.prompts.file else list(BUILTIN_PROMPTS)
        self.cursor = PromptCursor(len(self.prompts), rl.prompts_per_step, config.job.seed, rl.prompts.shuffle)
        self._token_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        token = os.environ.get(rl.reward.token_env) if rl.reward.token_env else None
        self.reward_client = RewardClient(
            self.reward_url, rl.reward.name, rl.reward.revision, rl.reward.timeout_s,
            rl.reward.max_retries, rl.reward.backoff_s, token,
        )
        vae_cfg = self.policy.vae.config
        side = config.model.image_size // int(vae_cfg.scale_factor_spatial)
        self.latent_shape = (int(self.transformer.config.latent_channel), side, side)
        candidates = max(rl.sample_steps - 1, 1)
        if not rl.uniform_timestep and rl.timesteps_per_sample > candidates:
            raise UserError(
                f"rl.timesteps_per_sample: {rl.timesteps_per_sample} exceeds the {candidates} sampler timesteps "
                f"a rollout of rl.sample_steps = {rl.sample_steps} offers; lower it or set 0 (all of them)"
            )

        self.seed_contract = plan.seed_contract(config)
        self.progress = {"step": 0}
        self.checkpoints = CheckpointManager(
            self.run_dir, config.checkpoint.keep, run_identity=plan.run_identity(config), algorithm="nft"
        )
        if not resume:
            return 0
        step = self.checkpoints.latest_committed()
        if step is None:
            raise UserError(f"{self.run_dir}: no committed checkpoint to resume from")
        # Refuse a changed seed contract before anything (the prompt cursor included) is loaded.
        saved = self.checkpoints.read_meta(step).get("extra", {}).get(SEED_CONTRACT_KEY, {})
        changes = contract_changes(saved, self.seed_contract)
        if changes:
            raise UserError(f"{self.run_dir}: the seed contract changed since step {step}: {'; '.join(changes)}")
        # The newest that loads; damaged newer ones are warned about and set aside (never deleted).
        step, _ = self.checkpoints.resume_latest(self._components())
        if self.progress["step"] != step:
            raise UserError(f"checkpoint step_{step} records step {self.progress['step']}; the checkpoint is inconsistent")
        return step

    def _components(self) -> dict[str, Any]:
        components: dict[str, Any] = {
            layout.POLICY: AdapterState(self.transformer, POLICY),
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

        lora.set_active(self.transformer, name)
        if name != POLICY:
            for key, param in lora.adapter_tensors(self.transformer, name).items():
                param.requires_grad_(False)
            for key, param in lora.adapter_tensors(self.transformer, POLICY).items():
                param.requires_grad_(True)

    def _tokens(self, rows: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        from cosmos_rl.models.text import tokenize_prompts

        size = self.config.model.image_size
        for row in rows:
            if row not in self._token_cache:
                cond, uncond = tokenize_prompts(self.policy.tokenizer, [self.prompts[row]], resolution=(size, size))
                self._token_cache[row] = (cond[0].to(self.device), uncond[0].to(self.device))
        return [self._token_cache[r][0] for r in rows], [self._token_cache[r][1] for r in rows]

    def _rollout_noise(self, step: int) -> torch.Tensor:
        """This rank's initial noise for the step's rows (see the module docstring for the clock)."""
        rows, seed = self.rl.prompts_per_step, self.config.job.seed
        if self.rl.rollout_seed_clock == "source_row":
            first = (step - 1) * rows  # rows visited before this step
            return torch.cat([
                torch.randn(1, *self.latent_shape, generator=_generator(derive_seed(seed, "rollout-row", self.rank, first + j), self.device), device=self.device)
                for j in range(rows)
            ])
        gen = _generator(derive_seed(seed, "rollout-step", self.rank, step), self.device)
        return torch.randn(rows, *self.latent_shape, generator=gen, device=self.device)

    def _mean_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        keys = sorted(values)
        vec = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(vec)
        vec /= self.world_size
        return dict(zip(keys, vec.tolist()))

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[world, *shape] of every rank's `tensor`."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    # ----------------------------------------------------------------- the step
    def train_step(self, step: int) -> dict[str, float]:
        """Rollout, reward, advantages, one optimizer step and the old-policy refresh for `step` (1-based)."""
        from cosmos_rl.data.images import save_image_grid
        from cosmos_rl.models import lora
        from cosmos_rl.models.packing import velocity
        from cosmos_rl.models.sampling import sample_latents
        from cosmos_rl.models.vae import decode_latents
        from cosmos_rl.rewards.client import RewardServiceError
        from cosmos_rl.rewards.functions import to_uint8

        rl = self.rl
        batch = self.cursor.next_batch(self.prompts)
        rows = [row for row, _ in batch]
        texts = [text for _, text in batch]
        cond, uncond = self._tokens(rows)

        # -- rollout with the old policy
        t0 = time.perf_counter()
        self._activate(OLD if rl.old.build_old else POLICY)
        with torch.no_grad():
            x0, sigmas = sample_latents(
                lambda x, s, ids: velocity(self.transformer, x, s, ids),
                self._rollout_noise(step), cond, uncond, rl.sample_steps, rl.sampler_shift, rl.guidance,
            )
            images = decode_latents(self.policy.vae, x0)
        self._activate(POLICY)
        t1 = time.perf_counter()

        # -- reward: own images, then everyone's
        pixels = to_uint8(images.permute(0, 2, 3, 1).cpu().numpy())
        try:
            own = self.reward_client.score(pixels, texts)
        except RewardServiceError as exc:
            from cosmos_rl.errors import RunFailed

            raise RunFailed(f"rank {self.rank}: {exc}") from None  # the message names the service
        rewards = self._gather(torch.tensor(own, dtype=torch.float64, device=self.device)).T.cpu()  # [rows, G]
        t2 = time.perf_counter()

        advantages = nft_math.clamp_advantages(
            nft_math.group_advantages(rewards, std_scope=rl.advantage_std_scope), rl.advantage_low, rl.advantage_high
        )
        r_all = nft_math.optimality(advantages, rl.r_map, rl.advantage_low, rl.advantage_high, rl.r_tau)
        r_own = r_all[:, self.rank].to(torch.float32)  # this rank's sample of each row

        # -- train on this rank's samples with the forward process
        train_metrics = self._train(step, x0, sigmas, cond, r_own)
        if rl.old.build_old and step % rl.old.update_every == 0:
            keep = nft_math.old_decay(step, rl.old.decay_cap, rl.old.decay_rate)
            lora.blend_adapter(self.transformer, OLD, POLICY, keep)
        t3 = time.perf_counter()

        if rl.sample_grid_every and step % rl.sample_grid_every == 0:
            everyone = self._gather(images.contiguous())  # [G, rows, 3, H, W]
            if self.rank == 0:
                grid = everyone.transpose(0, 1).reshape(-1, *images.shape[1:])  # row-major: one prompt per line
                save_image_grid(grid, self.run_dir / "samples" / f"step_{step}.png", nrow=self.world_size)

        local = {
            **{f"train/{k}": v for k, v in train_metrics.items()},
            "time/rollout_s": t1 - t0,
            "time/reward_s": t2 - t1,
            "time/train_s": t3 - t2,
        }
        metrics = self._mean_over_ranks(local)
        metrics["train/reward_mean"] = float(rewards.mean())
        metrics["train/reward_std"] = float(rewards.std(unbiased=False))
        metrics["train/advantage_mean"] = float(advantages.mean())
        return metrics

    def _train(self, step: int, x0: torch.Tensor, sigmas: torch.Tensor, cond: list[torch.Tensor], r: torch.Tensor) -> dict:
        from cosmos_rl.flow import noisy_latents, uniform_timesteps, velocity_target
        from cosmos_rl.models.packing import velocity

        rl = self.rl
        gen = _generator(derive_seed(self.config.job.seed, "train", self.rank, step), self.device)
        rows = x0.shape[0]
        if rl.uniform_timestep:
            per_sample = rl.timesteps_per_sample or max(rl.sample_steps - 1, 1)
            t = uniform_timesteps(rows * per_sample, gen, device=self.device)
        else:
            candidates = sigmas[:-1] if sigmas.numel() > 1 else sigmas
            per_sample = rl.timesteps_per_sample or candidates.numel()
            picks = [torch.randperm(candidates.numel(), generator=gen, device=self.device)[:per_sample] for _ in range(rows)]
            t = torch.cat([candidates[p] for p in picks])
        x0_rep = x0.repeat_interleave(per_sample, dim=0)
        ids = [ids for ids in cond for _ in range(per_sample)]
        r_rep = r.to(self.device).repeat_interleave(per_sample)
        eps = torch.randn(x0_rep.shape, generator=gen, device=self.device, dtype=x0_rep.dtype)
        x_t = noisy_latents(x0_rep, eps, t)
        target = velocity_target(x0_rep, eps)

        with torch.no_grad():
            if rl.old.build_old:
                self._activate(OLD)
                v_old = velocity(self.transformer, x_t, t, ids)
                self._activate(POLICY)
            else:
                v_old = None
            v_ref = None
            if rl.kl_beta:
                with self.policy.reference() as ref:
                    v_ref = velocity(ref, x_t, t, ids)
        v_theta = velocity(self.transformer, x_t, t, ids)
        if v_old is None:
            v_old = v_theta.detach()
        loss, metrics = nft_math.nft_loss(
            v_theta, v_old, v_ref if v_ref is not None else v_theta.detach(), target, r_rep,
            rl.beta, rl.policy_loss_scale, rl.kl_beta,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = self.policy.trainable_parameters()
        if rl.optimizer.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, rl.optimizer.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.optimizer.step()
        self.schedule.step()
        out = {k: float(v) for k, v in metrics.items() if k != "loss"}
        out["loss"] = float(metrics["loss"])
        out["grad_norm"] = float(norm)
        return out

    def shutdown(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class _CursorState(PlainState):
    def __init__(self, cursor):
        super().__init__()
        self.cursor = cursor

    def capture(self) -> dict[str, Any]:
        return self.cursor.state_dict()

    def restore(self, data: dict[str, Any]) -> None:
        self.cursor.load_state_dict(data)

