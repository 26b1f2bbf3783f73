"""The online step every online algorithm shares: rollout -> score -> gather -> the reward-failure rule.

Every model rank holds the whole (FSDP2-sharded) network with two LoRA adapters, "policy" (trained)
and "old" (the moving old policy, used for rollouts and the algorithm's old-policy forwards);
adapters disabled give the frozen reference. Per step every rank walks the same prompt rows and
makes ONE sample per row, so a prompt's group is the row's samples across the ranks (group_size =
world size).

`OnlineTrainer` is one process's share of that work, and an algorithm's rank trainer subclasses it
with its training half, `learn(step, rollouts, tables, cond[, condition][, actions=])` (`condition` only on a conditioned run,
`actions` only on a world-model run; NFT: `trainers/nft.py`), and, when
it samples its own way, its rollout sampler `sample` (GRPO's SDE: `trainers/grpo.py`). In a run,
each Ray actor (`trainers.ray_driver.RankWorker`) holds one and plays one rank; the ranks meet
through `RankCollectives` (gloo/NCCL). For fast tests, the test suite builds one trainer that plays
every rank of a group in one process (another `online_collectives.Collectives`) and gives the same
numbers; no manifest reaches it (the spec's one-sample-per-rank rule stands for runs).

Context parallelism (`grid.context_parallel` = N > 1, docs/long_clips.md): the world is G x N and
each sample is one context group's; `comm` (`online_collectives.RankCollectives`) then makes "rank"
below mean the data-parallel rank (noise, timesteps, scores and eval shares go by it), scores on a
group's first rank only, and every transformer forward runs with `set_context_parallel`.

Reward: each rank scores its own images (the service sees group_size concurrent requests; no rank
waits on another rank's decoding), then one all_gather gives every rank the [rows, group_size]
reward table, so every rank computes the same advantages.

Determinism: every random draw comes from a generator seeded by a hash of (job.seed, purpose,
rank, counter): rollout noise from the source-row counter (`rollout_seed_clock = "source_row"`:
the n-th prompt row the run visits) or the optimizer step (`"optimizer_step"`), training
timesteps and noise from the step. A rerun therefore reproduces every sample, and a resumed run
continues exactly.

World model (`[model.condition]` an action mode, rows from an episode suite's window keys:
`first_frames.py`): a row's rollouts are given its window's frame 0 (clean latent frame 0) and
its true action rows, held clean through the same packed forward (`actions=`, `action_layout=`)
as `models.generate` samples forward dynamics; the caption is the pipeline's structured action
caption of the window's task, the prompt string the rewards see is the key. Clean rows draw no
noise, so the seed contract is the unconditioned one. In policy mode (NFT only, `trains_policy`)
the rows are generated instead: each rollout starts them from seeded noise of their own
(`online_policy.rollout_action_noise`), returns them with its clip (`online_batch.ActionRollout`),
and the rewards get the executed part of them in the embodiment's units (`online_policy.executed_actions`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from cosmos_rl.planning import plan
from cosmos_rl.algorithms.multi_reward import reward_metrics, weighted_reward
from cosmos_rl.checkpoint.state import CursorState
from cosmos_rl.evaluation.grid import save_sample_grid
from cosmos_rl.checkpoint import CheckpointManager, LRScheduleState, OptimizerState, PlainState, RngStreams, layout
from cosmos_rl.core import schema
from cosmos_rl.core.condition import Condition
from cosmos_rl.core.errors import RewardUnavailable
from cosmos_rl.core.media import MediaSpec, latent_shape
from cosmos_rl.models.actions import ActionLayout, action_prompt_ids, start_rows
from cosmos_rl.rewards.multi import reward_terms
from cosmos_rl.trainers.first_frames import FirstFrames
from cosmos_rl.trainers.online_collectives import Collectives, RankCollectives
from cosmos_rl.checkpoint.policy import AdapterState, policy_component
from cosmos_rl.trainers.online_batch import ActionRollout, Rollout, _Batch
from cosmos_rl.trainers.online_scoring import RewardTables, ScoreFn, _scored_by
from cosmos_rl.trainers.async_scoring import OneStepOffScoring, _Pending, _PendingState
from cosmos_rl.trainers.online_state import REWARD_FAILED, SEED_CONTRACT_KEY

POLICY, OLD, EMA = "policy", "old", "ema"  # the LoRA adapter names (EMA: GRPO's moving average, rl.ema_decay)


def rollout_noise(
    rl: schema.OnlineRLBase, job_seed: int, rank: int, step: int, latent_shape: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """Rank `rank`'s initial noise for the rows of `step` (1-based); see the module docstring for the clock."""
    from cosmos_rl.models.generate import noise

    rows = rl.prompts_per_step
    if rl.rollout_seed_clock == "source_row":
        first = (step - 1) * rows  # rows visited before this step
        return torch.cat([
            noise((1, *latent_shape), job_seed, "rollout-row", rank, first + j, device=device, draw_on="device")
            for j in range(rows)
        ])
    return noise((rows, *latent_shape), job_seed, "rollout-step", rank, step, device=device, draw_on="device")


class OnlineTrainer(RewardTables, OneStepOffScoring):
    """The online state of one process (model, adapters, optimizer, prompts, checkpoints) and the
    shared half of its step; a subclass adds `learn` (and its own state in `_components`).

    It plays the ranks `comm.ranks`: one in a Ray run, all of a group in a single-process test group.
    """

    progress_fields: tuple[str, ...] = ("train/reward_mean",)
    trains_policy = False  # whether `learn` trains generated action rows (policy mode: NFT's)

    def __init__(self, config: schema.RunConfig, run_dir: Path, device: torch.device, comm: Collectives, score: ScoreFn):
        self.config, self.rl = config, config.rl
        self.run_dir = Path(run_dir)
        self.device, self.comm, self.score = device, comm, score
        self.reward_weights = {term.name: term.weight for term in reward_terms(config.rl)}
        # The named dimensions the rewards score besides their scores (`rewards.dimensions`: `videoalign.vq`),
        # which `score` returns beside them: logged, never trained on.
        self.dimension_names = tuple(getattr(score, "dimensions", ()))
        self.step = 0
        self.pending: _Pending | None = None  # rl.async_reward: the next step's rollout, made one policy version early
        self._scorer: ThreadPoolExecutor | None = None  # rl.async_reward: the scoring thread, made at the first scoring

    @classmethod
    def on_ray(cls, config, run_dir: Path, device, rank: int, world: int, resume: bool, context: dict):
        """One rank of a Ray run, scoring through the services the driver started (`context`)."""
        from cosmos_rl.rewards.multi import MultiRewardClient

        client = MultiRewardClient.from_config(config.rl, context["reward_urls"], context["reward_tokens"])
        layout = None
        if config.grid.context_parallel > 1:  # G x N ranks: consecutive N share one sample (docs/long_clips.md)
            from cosmos_rl.dist.context_parallel import data_context_layout

            layout = data_context_layout(config.grid.context_parallel, device.type)
        trainer = cls(config, run_dir, device, RankCollectives(rank, world, device, layout), _scored_by(client))
        trainer.build(resume)
        return trainer

    def has_holdout(self) -> bool:
        return False

    def items_per_step(self) -> int:
        return self.rl.group_size * self.rl.prompts_per_step

    def holdout(self, step: int) -> dict[str, float]:
        return {}

    # ----------------------------------------------------------------- build / resume
    def build(self, resume: bool) -> int:
        """Model, optimizer, prompts; on resume load the newest checkpoint. Returns the step."""
        from cosmos_rl.data.prompts import PromptCursor, run_prompts
        from cosmos_rl.models import lora
        from cosmos_rl.models.setup import build_optimizer, build_trainable

        rl, config = self.rl, self.config
        names = self.adapter_names()
        self.model = build_trainable(config, self.device, adapter_names=names)
        self.transformer = self.model.transformer
        if self.comm.cp is not None:
            from cosmos_rl.models.packing import set_context_parallel

            # Every forward of the run's networks (rollout, training, reference, [rl.eval]) splits
            # its vision tokens over the context group: policy and old are adapters of this
            # transformer, a full fine-tune's reference its own frozen copy.
            for network in (self.transformer, getattr(self.model, "frozen_ref", None)):
                if network is not None:
                    set_context_parallel(network, self.comm.cp)
        for name in names[1:]:
            lora.copy_adapter(self.transformer, POLICY, name)  # NFT's old policy, GRPO's average: each starts as the policy, exactly
        if self.model.lora:
            lora.set_active(self.transformer, POLICY)  # the only trainable adapter, for the whole run
        self.optimizer, self.schedule = build_optimizer(self.model.trainable_parameters(), rl.optimizer)

        self.prompts = run_prompts(rl)
        self.cursor = PromptCursor(len(self.prompts), rl.prompts_per_step, config.job.seed, rl.prompts.shuffle)
        self._token_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.media = MediaSpec.from_model_config(config.model)
        self.latent_shape = latent_shape(self.media, self.model.vae.config, self.transformer.config)
        # A conditioned run ([model.condition], e.g. image to video): every row's given frames,
        # checked now so a bad row stops the run before step 1.
        self.condition = Condition.from_model_config(config.model)
        self.first_frames = FirstFrames(self.condition, rl.prompts.file, self.media) if self.condition.is_conditioned else None
        if self.condition.has_actions:  # the folder's transformer must carry action heads that fit the embodiment
            from cosmos_rl.core.errors import UserError

            mode = self.condition.action.mode
            if mode != "forward_dynamics" and not (mode == "policy" and self.trains_policy):
                raise UserError(f"model.condition.kind = {self.condition.kind.name!r}: {self.rl.algorithm} trains forward_dynamics"
                                f"{' or policy' if self.trains_policy else ''} in this release (policy: nft)")
            try:
                ActionLayout.of(self.condition.action, 1).check(self.transformer.config)
            except ValueError as exc:
                raise UserError(f"model.path: {exc}; use a Cosmos3 folder built with action_gen = true (Cosmos3-Nano has them)") from None

        self.evaluator = None
        if rl.eval.every:  # [rl.eval]: built now, so a bad evaluation prompt stops the run before step 1
            from cosmos_rl.evaluation.evaluator import Evaluator

            self.evaluator = Evaluator.for_run(config, self.model, self.device)

        self.seed_contract = plan.seed_contract(config)
        self.progress = {"step": 0}
        self.checkpoints = CheckpointManager(
            self.run_dir, config.checkpoint.keep, run_identity=plan.run_identity(config), algorithm=config.rl.algorithm
        )
        if not resume:
            return 0
        # The caller has refused a changed seed contract (online_state.check_seed_contract) before
        # anything was built; here the newest loadable checkpoint is loaded (damaged newer ones are
        # warned about and set aside, never deleted).
        step, _ = self.checkpoints.resume_latest(self._components())
        assert self.progress["step"] == step, f"checkpoint step_{step} records step {self.progress['step']}"
        self.step = step
        return step

    def adapter_names(self) -> tuple[str, ...]:
        """The network's LoRA adapters, the trained `policy` first."""
        return (POLICY, OLD) if self.rl.old.build_old else (POLICY,)

    def model_adapter(self) -> str:
        """The adapter that is the run's model, which `[rl.eval]` samples (GRPO: its moving average when kept)."""
        return POLICY

    def _components(self) -> dict[str, Any]:
        components: dict[str, Any] = {
            layout.POLICY: policy_component(self.model.state_module(), lora=self.model.lora),
            layout.OPTIMIZER: OptimizerState(self.transformer, self.optimizer),
            layout.LR_SCHEDULE: LRScheduleState(self.schedule),
            layout.DATA_CURSOR: CursorState(self.cursor),
            layout.PROGRESS: PlainState(self.progress),
            layout.RNG: RngStreams(),
        }
        if self.rl.old.build_old:
            components[layout.OLD] = AdapterState(self.transformer, OLD)
        if self.rl.async_reward:  # the next step's rollout: made by the policy before the last learn, which no other component holds
            components[layout.PENDING_ROLLOUT] = _PendingState(self)
        return components

    def save(self, step: int) -> str:
        self.progress["step"] = step
        path = self.checkpoints.save(step, self._components(), extra_meta={SEED_CONTRACT_KEY: self.seed_contract})
        return str(path)

    # ----------------------------------------------------------------- helpers
    def _activate(self, name: str) -> None:
        """Run forwards with adapter `name` while only the policy adapter stays trainable.

        The flags are set once, at build (`lora.set_active(POLICY)`), and never flipped after:
        FSDP2 built its gradient plan from the policy-trainable state.
        """
        from cosmos_rl.models import lora

        if not self.model.lora:  # a full fine-tune has one network and no old policy (preflight)
            assert name == POLICY, name
            return
        lora.use_adapter(self.transformer, name)

    def _tokens(self, rows: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        from cosmos_rl.models.text import model_prompt_ids

        template = self.model.parts.prompt_template
        for row in rows:
            if row not in self._token_cache:
                if self.condition.has_actions:  # the pipeline's structured action caption of the window's task

                    caption = self.first_frames.caption(row)
                    cond, uncond = action_prompt_ids(self.model.tokenizer, template, [caption], self.condition.action, self.media)
                else:
                    cond, uncond = model_prompt_ids(self.model.tokenizer, template, [self.prompts[row]], self.media)
                self._token_cache[row] = (cond[0].to(self.device), uncond[0].to(self.device))
        return [self._token_cache[r][0] for r in rows], [self._token_cache[r][1] for r in rows]

    # ----------------------------------------------------------------- the step
    def train_step(self, step: int) -> dict[str, float]:
        """Rollout, reward, the algorithm's training half (`learn`) for `step` (1-based).

        If the reward service fails for good on any rank, every rank puts its prompt cursor back
        and stops before training: the rank(s) that failed raise `RewardUnavailable`, the others
        return `{REWARD_FAILED: 1}`. Nothing else of the step has changed state (rollout draws come
        from their own generators), so the caller can still commit step - 1 exactly.

        With rl.async_reward the step is `_async_step`'s: the rollout of step + 1 runs while this
        step's samples are scored; on a reward failure the cursor goes back to before step + 1's
        draw and this step's rollout stays the pending one, which the checkpoint of step - 1 holds.
        """
        if self.rl.async_reward:
            return self._async_step(step)
        batch = self._draw()
        t0 = time.perf_counter()
        rollouts = self.rollout(step, batch.cond, batch.uncond, batch.condition, **batch.world)
        t1 = time.perf_counter()
        try:
            tables = self._scores(rollouts, batch.texts)
        except RewardUnavailable:
            self.cursor.load_state_dict(batch.cursor_before)  # nothing of this step happened
            raise
        if tables is None:
            self.cursor.load_state_dict(batch.cursor_before)
            return {REWARD_FAILED: 1.0}  # another rank raises the reason; this one only stops
        return self._learn_and_report(step, batch, rollouts, tables, t1 - t0, time.perf_counter() - t1)

    def _draw(self) -> "_Batch":
        """The next prompt rows and what a rollout of them needs (the cursor moves)."""
        cursor_before = self.cursor.state_dict()
        batch = self.cursor.next_batch(self.prompts)
        return self._batch_of([row for row, _ in batch], [text for _, text in batch], cursor_before)

    def _batch_of(self, rows: list[int], texts: list[str], cursor_before: dict) -> "_Batch":
        cond, uncond = self._tokens(rows)
        # I2V: the rows' clean first latent frames [rows, C, 1, h, w], the same for every rank
        condition = None if self.first_frames is None else self.first_frames.latents(self.model.vae, rows, self.device)
        # World model: the rows' true action rows [rows, chunk, action_dim], clean in rollouts and training
        actions = None
        if self.condition.has_actions and not self.condition.action.generates_actions:  # policy mode: the rows are generated
            actions = self.first_frames.action_rows(rows, int(self.transformer.config.action_dim), self.device)
        world = {} if actions is None else {"actions": actions}
        return _Batch(rows, texts, cursor_before, cond, uncond, condition, world)

    def _learn_and_report(self, step: int, batch: "_Batch", rollouts: list[Rollout], tables: dict[str, torch.Tensor],
                          rollout_s: float, reward_s: float) -> dict[str, float]:
        rl, cond, condition, world, texts = self.rl, batch.cond, batch.condition, batch.world, batch.texts
        dimension_tables = {name: tables[name] for name in self.dimension_names}
        tables = {name: table for name, table in tables.items() if name in self.reward_weights}
        rewards = weighted_reward(tables, self.reward_weights)
        t2 = time.perf_counter()
        # An algorithm written before I2V takes no condition: it is passed only to an I2V run's step.
        learn_args = (step, rollouts, tables, cond) if condition is None else (step, rollouts, tables, cond, condition)
        per_rank, extra = self.learn(*learn_args, **world)
        t3 = time.perf_counter()

        if rl.sample_grid_every and step % rl.sample_grid_every == 0:
            everyone = self.comm.gather([pixels.to(self.device) for _, _, pixels in rollouts]).cpu()  # [G, rows, (F,) H, W, 3]
            if self.comm.leader:  # one writer (with context parallelism, data-parallel rank 0 is several processes)
                save_sample_grid(self.run_dir / "samples" / f"step_{step}.png", everyone, texts, rewards)

        timings = {"time/rollout_s": rollout_s, "time/reward_s": reward_s, "time/train_s": t3 - t2}
        metrics = self.comm.mean([{**{f"train/{k}": v for k, v in m.items()}, **timings} for m in per_rank])
        metrics["train/reward_mean"] = float(rewards.mean())
        metrics["train/reward_std"] = float(rewards.std(unbiased=False))
        if rl.rewards:  # several rewards: each one's own mean and std too
            metrics.update(reward_metrics(tables))
        metrics.update(reward_metrics(dimension_tables))  # each dimension as its own reward: train/<reward>.<dim>/reward_mean
        metrics.update(extra)
        self.step = step
        return metrics

    def learn(self, step: int, rollouts: list[Rollout], tables: dict[str, torch.Tensor], cond: list[torch.Tensor],
              condition: torch.Tensor | None = None, actions: torch.Tensor | None = None):
        """The algorithm's training half: (one metrics dict per played rank, step metrics to add).
        `condition`: an I2V run's clean first latent frames of the rows (None: text-to-video);
        `actions` (passed only on a world-model run): the rows' clean action rows."""
        raise NotImplementedError

    def rollout(self, step: int, cond: list[torch.Tensor], uncond: list[torch.Tensor], condition: torch.Tensor | None = None,
                actions: torch.Tensor | None = None) -> list[Rollout]:
        """One sample per row for each rank this process plays, with the old policy (or the policy),
        each rank's by `sample` from its seeded initial noise (and, I2V, the rows' first latent frames;
        world model, their clean action rows)."""
        from cosmos_rl.models.sampler_settings import SamplerSettings
        from cosmos_rl.dist.fsdp import gathered_while_sampling
        from cosmos_rl.models.text_kv import held_while_sampling

        rl = self.rl
        # The model's own scheduler; rl.sampler_shift None keeps its shift.
        settings = SamplerSettings(steps=rl.sample_steps, shift=rl.sampler_shift, guidance=rl.guidance)
        self._activate(OLD if rl.old.build_old else POLICY)
        rollouts = []
        with torch.no_grad(), gathered_while_sampling(self.transformer), held_while_sampling(self.transformer):
            for rank in self.comm.ranks:
                start = rollout_noise(rl, self.config.job.seed, self.noise_rank(rank), step, self.latent_shape, self.device)
                given = {} if condition is None else {"condition": condition}
                if actions is not None:
                    given["actions"] = actions
                elif self.condition.has_actions:  # policy mode: the action rows start from noise of their own
                    from cosmos_rl.trainers.online_policy import rollout_action_noise

                    given["actions"] = rollout_action_noise(rl, self.config.job.seed, self.noise_rank(rank), step, self.condition.action.chunk,
                                                            int(self.transformer.config.action_dim), self.device)  # fmt: skip
                rollouts.append(self.sample(step, rank, start, (cond, uncond), settings, **given))
        self._activate(POLICY)
        return rollouts

    def noise_rank(self, rank: int) -> int:
        """The rank whose seed draws `rank`'s initial noise: its own (an algorithm that starts a group
        from one noise answers one rank for all)."""
        return rank

    def sample(self, step: int, rank: int, noise: torch.Tensor, prompt_ids, settings, condition: torch.Tensor | None = None,
               actions: torch.Tensor | None = None) -> Rollout:
        """Rank `rank`'s rollout of `step` from its initial `noise`: the algorithm's rollout sampler.

        This default is the model's own UniPC sampler (`models.generate.generate`), recording the
        sigmas it evaluated the model at (NFT trains at them). An algorithm with a sampler of its own
        (GRPO's SDE) overrides it; it runs under no grad, the gathered weights and the rollout's
        adapter, and returns (x0 latents, the sigmas the model was evaluated at, uint8 pixels).
        `condition` (I2V): the clean first latent frames `generate` holds (x0 keeps them).
        `actions` (forward dynamics): the rows' clean action rows [rows, chunk, action_dim], held as
        `generate` holds given rows (every row clean, so no noise is drawn for them); in policy mode
        their initial noise, generated beside the frames and returned (`ActionRollout`).
        """
        from cosmos_rl.models.generate import generate

        sigmas: list[torch.Tensor] = []
        extra = {} if actions is None else self.action_inputs(actions)
        out = generate(
            self.model.parts, self.media, prompt_ids, noise, settings, condition=condition,
            record=lambda index, sigma, latents, v: sigmas.append(sigma), **extra,
        )
        if actions is not None and self.condition.action.generates_actions:
            return ActionRollout(out[0], torch.stack(sigmas), out[1], out[2])
        return out[0], torch.stack(sigmas), out[1]

    def sample_velocity(self, transformer, x: torch.Tensor, sigma: torch.Tensor, ids: list[torch.Tensor], clean: int = 0,
                        actions: torch.Tensor | None = None):
        """The velocity [B, C, T, h, w] of this run's samples in one packed forward, as a rollout
        sampled them (NFT's training forwards, GRPO's rollout and training forwards): at the clips'
        time positions (the fps modulation and the VAE's temporal compression: training at others
        would train another model than the one sampled), the first `clean` latent frames a
        condition's (clean, no timestep, velocity 0) and, forward dynamics, each sample's true
        action rows `actions` [B, chunk, action_dim] beside it, clean (their velocity is dropped:
        it trains nothing). In policy mode `actions` are the noisy rows at `sigma` and the return is
        (v, the action velocity [B, chunk, action_dim]). An image run's forward is the plain packed
        forward (no keywords)."""
        from cosmos_rl.core.media import frame_timing
        from cosmos_rl.models.packing import velocity

        timing = frame_timing(self.media, self.model.vae.config)
        if actions is None:
            return velocity(transformer, x, sigma, ids, clean_frames=clean, **timing)
        if actions.shape[0] != x.shape[0]:
            raise ValueError(f"one action chunk per sample: {x.shape[0]} samples, {actions.shape[0]} chunks")
        out = velocity(transformer, x, sigma, ids, clean_frames=clean, **timing, **self.action_inputs(actions))
        return out if self.condition.action.generates_actions else out[0]

    def action_inputs(self, actions: torch.Tensor) -> dict:
        """`actions=` and `action_layout=` of a batch of rows [B, chunk, action_dim]: forward dynamics'
        clean rows (the layout's clean_rows are the chunk), or policy mode's noisy ones (none clean),
        padding columns zeroed either way."""

        layout = ActionLayout.of(self.condition.action, int(actions.shape[0]))
        if self.condition.action.generates_actions:
            return {"actions": start_rows(actions, None, layout), "action_layout": layout}
        assert all(clean == layout.rows for clean in layout.clean_rows), "forward dynamics holds every action row clean"
        return {"actions": start_rows(torch.zeros_like(actions), actions, layout), "action_layout": layout}

    # ----------------------------------------------------------------- [rl.eval]
    def evaluate(self, step: int) -> dict[str, float]:
        """The run's model (`model_adapter`) on the `[rl.eval]` items, split over the ranks; the group's
        `eval/` metrics on every rank. The policy is the adapter in use again after."""
        from cosmos_rl.evaluation.evaluator import evaluate_ranks

        self._activate(self.model_adapter())
        try:
            return evaluate_ranks(self.evaluator, self.transformer, self.comm.ranks, self.comm.world_size, self.comm.mean)
        finally:
            self._activate(POLICY)


