"""Two stand-in algorithms from outside the package, each a config, a loss and a step only, named in a
manifest as `rl.algorithm = "standin_algorithms:RANKS"` (or `:ONLINE`): the worked example of
docs/architecture.md, "Adding an algorithm", and the proof that a new algorithm needs no edit under
cosmos_rl/ (tests/test_algorithm_registry.py trains each through the launch path).

- RANKS (launcher kind "ranks": torchrun ranks, or Ray actors from the driver): plain flow matching
  on latents drawn from a seed, one fixed prompt (no data source).
- ONLINE (launcher kind "driver": the Ray driver with reward services): reward-weighted flow
  matching on the group's own rollouts, weights sigmoid(group advantage).
"""

from __future__ import annotations

import attrs
import torch

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema, schema_online
from cosmos_rl.config.preflight.grid import data_parallel_grid
from cosmos_rl.config.preflight.online import online_rules
from cosmos_rl.core.flow import noisy_latents, velocity_target
from cosmos_rl.core.media import latent_shape
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.setup import build_trainable, optimizer_step
from cosmos_rl.models.text import model_prompt_ids
from cosmos_rl.core.seeds import derive_seed
from cosmos_rl.trainers.online import OnlineTrainer
from cosmos_rl.trainers.spmd import SPMDTrainer


# ------------------------------------------------------------------------------------- configs
@schema.frozen
class PlainFlowConfig(schema.RLBase):
    algorithm: str = schema.required("`standin_algorithms:RANKS`.")
    samples_per_step: int = schema.knob(2, "Latents per optimizer step, split over the ranks.")


@schema.frozen
class RewardWeightedConfig(schema.OnlineRLBase):
    algorithm: str = schema.required("`standin_algorithms:ONLINE`.")
    temperature: float = schema.knob(1.0, "Weights are sigmoid(advantage / temperature).")


for _cls in (PlainFlowConfig, RewardWeightedConfig):
    attrs.resolve_types(_cls, {**vars(schema), **vars(schema_online), **globals()})


def plain_rules(c: schema.RunConfig, rl: PlainFlowConfig, r) -> None:
    data_parallel_grid(c, r)
    r.at_least("rl.samples_per_step", rl.samples_per_step, 1)


def weighted_rules(c: schema.RunConfig, rl: RewardWeightedConfig, r) -> None:
    online_rules(c, rl, r)
    r.positive("rl.temperature", rl.temperature)


# --------------------------------------------------------------------------------------- losses
def weighted_velocity_mse(v: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """mean_i(w_i * mean((v_i - target_i)^2)); w = 1 is plain flow matching."""
    per_sample = (v - target).pow(2).flatten(1).mean(1)
    return (weights * per_sample).mean(), {"mse": per_sample.mean().detach()}


# ----------------------------------------------------------------------------------------- steps
class PlainFlowTrainer(SPMDTrainer):
    def setup(self) -> None:
        self.model = build_trainable(self.config, self.device, with_reference=False)
        self.module, self.lora, self.params = self.model.state_module(), self.model.lora, self.model.trainable_parameters()
        cond, _ = model_prompt_ids(self.model.tokenizer, self.model.parts.prompt_template, ["a red square"], self.media)
        self.ids = cond[0].to(self.device)
        self.shape = latent_shape(self.media, self.model.vae.config, self.model.transformer.config)  # (C, T, h, w)

    def cursor_state(self):
        return None  # no data source: every draw comes from (seed, step, rank)

    def items_per_step(self) -> int:
        return self.rl.samples_per_step

    def sampling_transformer(self):
        return self.model.transformer

    def train_step(self, step: int) -> dict[str, float]:
        self._next(step)
        count = self.rl.samples_per_step // self.world
        gen = torch.Generator().manual_seed(derive_seed("standin", self.config.job.seed, step, self.rank))
        x0, eps = torch.randn(count, *self.shape, generator=gen), torch.randn(count, *self.shape, generator=gen)
        t = torch.rand(count, generator=gen)
        v = velocity(self.module, noisy_latents(x0, eps, t), t, [self.ids] * count)
        loss, _ = weighted_velocity_mse(v, velocity_target(x0, eps), torch.ones(count))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm, lr = optimizer_step(self.params, self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        self.step += 1
        loss = self._all_mean(torch.tensor([float(loss.detach())], dtype=torch.float64))
        return {"train/loss": float(loss[0]), "train/grad_norm": float(grad_norm), "train/lr": lr}


class RewardWeightedTrainer(OnlineTrainer):
    def learn(self, step, rollouts, tables, cond):
        from cosmos_rl.algorithms.multi_reward import weighted_reward

        rewards = weighted_reward(tables, self.reward_weights)  # [rows, G]
        advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True, unbiased=False) + 1e-4)
        losses, metrics = [], []
        for rank, (x0, _, _) in zip(self.comm.ranks, rollouts):
            gen = torch.Generator().manual_seed(derive_seed("standin-online", self.config.job.seed, step, rank))
            eps, t = torch.randn(x0.shape, generator=gen), torch.rand(x0.shape[0], generator=gen)
            v = velocity(self.transformer, noisy_latents(x0, eps, t), t, cond)
            weights = torch.sigmoid(advantages[:, rank].float() / self.rl.temperature)
            loss, extra = weighted_velocity_mse(v, velocity_target(x0, eps), weights)
            losses.append(loss)
            metrics.append({"loss": float(loss.detach()), "mse": float(extra["mse"])})
        self.optimizer.zero_grad(set_to_none=True)
        torch.stack(losses).mean().backward()
        norm, _ = optimizer_step(self.model.trainable_parameters(), self.optimizer, self.schedule, self.rl.optimizer.grad_clip)
        return [{**m, "grad_norm": float(norm)} for m in metrics], {}


# -------------------------------------------------------------------------------------- entries
RANKS = algorithms.Algorithm(
    name="standin_algorithms:RANKS", config=PlainFlowConfig, title="plain flow matching (a stand-in)",
    launcher="ranks", trainer=PlainFlowTrainer, preflight=plain_rules,
)  # fmt: skip
ONLINE = algorithms.online(
    name="standin_algorithms:ONLINE", config=RewardWeightedConfig, title="reward-weighted flow matching (a stand-in)",
    trainer=RewardWeightedTrainer, preflight=weighted_rules,
)  # fmt: skip
