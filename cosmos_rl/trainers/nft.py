"""The DiffusionNFT rank trainer: the online step (`trainers/online.py`) with NFT's training half.

After the shared rollout and reward: group advantages (per-prompt, normalised, clamped), the
optimality map r, training on this process's own samples with the forward process at the
rollout's timesteps (v_old from the old adapter, v_ref with adapters off when the KL is weighed or
logged, v_theta), `algorithms.nft.nft_loss`, one optimizer step, then the old-policy refresh.

Image-to-video (`[model.condition]`): the rollouts' first latent frames are the condition; in the
training forwards they stay clean (x_t keeps x0's frames there, the model is told they are clean
and predicts velocity 0 for them) and the loss is taken over the other frames only, as SFT's
flow loss leaves its clean frames out. The draws (timesteps, noise) are those of text-to-video.

Forward dynamics (the world model, `trainers/online.py`): besides frame 0 every training forward
carries the rows' true action rows, clean (no timestep, velocity 0, as the rollout held them) in
the same packed forward (`actions=`, `action_layout=`); the action velocity is in no loss, so the
loss is the generated latent frames' alone, as for I2V.

Policy mode (`trains_policy`): the rollouts generated their action rows (`ActionRollout.actions`,
a0), and they are trained as the frames are: noised at the same timestep t as their sample, with
noise drawn after the frames' (so the frames' draws are forward dynamics'), carried noisy through
the same packed forward, and the action velocity trained toward eps - a0 by the same NFT loss (its
own per-sample errors over the embodiment's raw columns; the padding columns are in no loss), added
to the frames' loss as SFT adds its action loss (`algorithms.sft.action_flow_loss`). `policy_loss`
and `kl_loss` are then the sums of the two; `actions_policy_loss` (and `actions_kl_loss`) the
actions' part. Frame 0 stays clean and out of every loss.
"""

from __future__ import annotations

import torch

from cosmos_rl.algorithms import nft as nft_math
from cosmos_rl.algorithms.multi_reward import combined_advantages
from cosmos_rl.core import schema
from cosmos_rl.core.seeds import derive_seed
from cosmos_rl.trainers.online import OLD, POLICY, OnlineTrainer, rollout_noise

__all__ = ["NFTTrainer", "METRIC_NAMES", "rollout_noise"]

METRIC_NAMES = (
    "train/reward_mean", "train/reward_std", "train/policy_loss", "train/kl_loss", "train/advantage_mean",
    "train/optimality_mean", "train/optimality_second_moment", "train/positive_error", "train/negative_error",
    "time/rollout_s", "time/reward_s", "time/train_s", "time/orchestration_s",
)  # fmt: skip


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


class NFTTrainer(OnlineTrainer):
    """One process's share of an NFT run (the online state and step: OnlineTrainer)."""

    progress_fields = ("train/reward_mean", "train/policy_loss")
    trains_policy = True

    def __init__(self, config, run_dir, device, comm, score):
        if not isinstance(config.rl, schema.NFTConfig):
            raise TypeError("NFTTrainer needs an NFT config")
        super().__init__(config, run_dir, device, comm, score)

    def learn(self, step, rollouts, tables, cond, condition=None, actions=None):
        from cosmos_rl.models import lora

        rl, ranks = self.rl, self.comm.ranks
        advantages = nft_math.clamp_advantages(
            combined_advantages(tables, self.reward_weights, rl.reward_combine, std_scope=rl.advantage_std_scope),
            rl.advantage_low, rl.advantage_high,
        )
        r_all = nft_math.optimality(advantages, rl.r_map, rl.advantage_low, rl.advantage_high, rl.r_tau, rl.linear_map)

        # -- train on this process's samples with the forward process
        samples = []
        for rank, rollout in zip(ranks, rollouts):  # a policy-mode rollout also carries its generated rows
            x0, sigmas, _ = rollout
            samples.append((rank, x0, sigmas, r_all[:, rank].to(torch.float32), getattr(rollout, "actions", None)))
        clean = 0 if condition is None else int(condition.shape[2])  # leading latent frames held clean
        train_metrics = self._train(step, samples, cond, clean, actions)
        if rl.old.build_old and step % rl.old.update_every == 0:
            keep = nft_math.old_decay(step, rl.old.decay_cap, rl.old.decay_rate, rl.old.flat_steps)
            lora.blend_adapter(self.transformer, OLD, POLICY, keep)
        extra = {
            "train/advantage_mean": float(advantages.mean()),
            # near the clamp bound = the advantages are pinned there (rewards too spread for the range)
            "train/advantage_abs_mean": float(advantages.abs().mean()),
        }
        return train_metrics, extra

    def _training_inputs(self, step: int, rank: int, x0: torch.Tensor, sigmas: torch.Tensor, cond: list[torch.Tensor], r: torch.Tensor,
                         clean: int = 0, a0: torch.Tensor | None = None):
        """Rank `rank`'s training batch: its samples noised at the training timesteps (drawn from
        a generator of (job.seed, rank, step)), the velocity target and each row's optimality.
        The first `clean` latent frames (I2V's condition) are left at x0, unnoised. With a policy
        rollout's generated rows `a0` the last item is (noisy rows, their velocity target), else None."""
        from cosmos_rl.core.flow import noisy_latents, uniform_timesteps, velocity_target

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
        x_t = noisy_latents(x0_rep, eps, t)
        if clean:
            x_t[:, :, :clean] = x0_rep[:, :, :clean]
        rows = None
        if a0 is not None:  # drawn after the frames' noise: the frames' draws stay forward dynamics'
            a0_rep = a0.repeat_interleave(per_sample, dim=0)
            eps_a = torch.randn(a0_rep.shape, generator=gen, device=self.device, dtype=a0_rep.dtype)
            rows = (noisy_latents(a0_rep, eps_a, t), velocity_target(a0_rep, eps_a))
        return x_t, t, ids, velocity_target(x0_rep, eps), r_rep, rows

    def _rank_loss(self, measure_kl: bool, clean: int, x_t, t, ids, target, r_rep, generated=None, actions: torch.Tensor | None = None):
        from functools import partial

        rl = self.rl
        if generated is not None:  # policy mode: the generated rows, noisy at t, trained beside the frames
            return self._policy_loss(measure_kl, clean, x_t, t, ids, target, r_rep, *generated)
        # Forward dynamics: each training row beside its true action rows (`sample_velocity`).
        rows = None if actions is None else actions.repeat_interleave(x_t.shape[0] // actions.shape[0], dim=0)
        v_theta, v_old, v_ref = self._velocities(partial(self.sample_velocity, clean=clean, actions=rows), measure_kl, x_t, t, ids)
        # The clean frames' target (eps - x0) is no velocity the model is asked for: left out of the loss.
        v_theta, v_old, target = v_theta[:, :, clean:], v_old[:, :, clean:], target[:, :, clean:]
        v_ref = None if v_ref is None else v_ref[:, :, clean:]
        return nft_math.nft_loss(
            v_theta, v_old, v_ref, target, r_rep,
            rl.beta, rl.policy_loss_scale, rl.kl_beta, x0_weighting_t=t if rl.x0_weighting else None,
        )

    def _velocities(self, velocity, measure_kl: bool, x_t, t, ids):
        """(policy, old, reference) velocities of one training batch: the old adapter's and the
        reference's without gradient (old = the policy's, detached, when no old copy is kept;
        reference None when neither the KL term nor its measurement needs it). A velocity may be a
        tensor or a (frames, action rows) pair."""
        rl = self.rl
        with torch.no_grad():
            old = None
            if rl.old.build_old:
                self._activate(OLD)
                old = velocity(self.transformer, x_t, t, ids)
                self._activate(POLICY)
            ref = None
            if rl.kl_beta or measure_kl:
                with self.model.reference() as network:
                    ref = velocity(network, x_t, t, ids)
        theta = velocity(self.transformer, x_t, t, ids)
        if old is None:
            old = tuple(v.detach() for v in theta) if isinstance(theta, tuple) else theta.detach()
        return theta, old, ref

    def _policy_loss(self, measure_kl: bool, clean: int, x_t, t, ids, target, r_rep, a_t, target_a):
        """Policy mode's loss (module docstring): the NFT loss of the generated frames plus that of
        the generated action rows over the embodiment's raw columns, from the same forwards."""
        from functools import partial

        rl, width = self.rl, self.condition.action.width
        theta, old, ref = self._velocities(partial(self.sample_velocity, clean=clean, actions=a_t), measure_kl, x_t, t, ids)
        loss_args = dict(beta=rl.beta, policy_loss_scale=rl.policy_loss_scale, kl_beta=rl.kl_beta, x0_weighting_t=t if rl.x0_weighting else None)
        frames, frame_metrics = nft_math.nft_loss(theta[0][:, :, clean:], old[0][:, :, clean:], None if ref is None else ref[0][:, :, clean:],
                                                  target[:, :, clean:], r_rep, **loss_args)  # fmt: skip
        rows, row_metrics = nft_math.nft_loss(theta[1][..., :width], old[1][..., :width], None if ref is None else ref[1][..., :width],
                                              target_a[..., :width], r_rep, **loss_args)  # fmt: skip
        metrics = dict(frame_metrics)
        for name in ("loss", "policy_loss", "kl_loss"):
            if name in row_metrics:
                metrics[name] = frame_metrics[name] + row_metrics[name]
                if name != "loss":
                    metrics[f"actions_{name}"] = row_metrics[name]
        return frames + rows, metrics

    def _train(self, step: int, samples: list, cond: list[torch.Tensor], clean: int = 0,
               actions: torch.Tensor | None = None) -> list[dict[str, float]]:
        """One optimizer step on every played rank's samples; one metrics dict per played rank.

        The loss is the mean of the played ranks' losses: FSDP averages gradients over ranks, so a
        process playing all G ranks takes the same step as G processes playing one each.
        """
        from cosmos_rl.dist.fsdp import gathered_while_training
        from cosmos_rl.models.setup import optimizer_step

        # With kl_beta = 0 the KL is measured only on the steps whose metrics are logged (one
        # no-grad reference forward more there), so train/kl_loss is never a number not computed.
        job = self.config.job
        measure_kl = step % job.log_every == 0 or step == self.rl.max_steps
        losses, metrics = [], []
        with gathered_while_training(self.transformer):
            for rank, x0, sigmas, r, a0 in samples:
                loss, rank_metrics = self._rank_loss(measure_kl, clean, *self._training_inputs(step, rank, x0, sigmas, cond, r, clean, a0),
                                                     actions=actions)
                losses.append(loss)
                metrics.append(rank_metrics)
            loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        norm, _ = optimizer_step(self.model.trainable_parameters(), self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        out = []
        for rank_metrics in metrics:
            row = {k: float(v) for k, v in rank_metrics.items() if k != "loss"}
            row["loss"] = float(rank_metrics["loss"])
            row["grad_norm"] = float(norm)
            out.append(row)
        return out
