"""Sampling and scoring an evaluation's images with one model; the same images on every call.

Each item's starting noise comes from its own generator, seeded by (the label "eval", the seed
index, the caption) on the CPU (`models.generate.noise`): it does not depend on the run's job.seed,
the device, the batch an item lands in or the rank that samples it, so two runs (and a run and its
base) are compared on identical noise. Items are sampled in batches of `batch_size` by
`models.generate.generate` (as the NFT rollout is) and scored in-process by the suite's verifier or
a built-in weight-free reward (`evaluation.scores`), or through reward services as a run is (a
model reward's folder, a service's url, several weighted: `evaluation.served`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import torch

from cosmos_rl.evaluation.prompts import Item, eval_captions, make_items, rank_share
from cosmos_rl.evaluation.scores import EvalScores, PromptTotals, Totals, caption_groups, gold_metrics, groups_of, score_images, with_intervals
from cosmos_rl.config.run_suite import run_suite
from cosmos_rl.config.sampler import DEFAULT_BATCH, run_settings
from cosmos_rl.suites import registry as suites
from cosmos_rl.suites.base import Suite
from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.core.condition import Condition
from cosmos_rl.core.media import MediaSpec, latent_shape


class Evaluator:
    """The items of one evaluation and the frozen parts (tokenizer, VAE) that sample them."""

    def __init__(
        self, captions: Sequence[str], seeds: int, reward: str, settings: SamplerSettings, *,
        tokenizer, vae, media: MediaSpec, latent_shape: tuple[int, ...], device: torch.device,
        batch_size: int = DEFAULT_BATCH, origin: str = "the evaluation prompts", model_parts=None,
        condition: Condition = Condition(), suite: Suite | None = None, gold: str = "", scorer=None,
    ):  # fmt: skip
        # The suite whose tasks (and verifier, with its reward) count the images: the reward's own by default.
        suite = suite if suite is not None else suites.reward_owner(reward)
        if suite is None:
            raise ValueError(f"reward {reward!r} is no suite's: name the suite whose prompts the evaluation scores")
        self.suite = suite
        # Rewards scored through services (`evaluation.served.ServedRewards`: a model folder, a url,
        # several weighted) score each item with one number; None = `reward` in-process.
        self.scorer = scorer
        self.groups = caption_groups(captions, reward, origin, suite)
        self.captions = list(captions)
        self.items = make_items(self.captions, seeds)
        self.seeds = seeds
        self.reward, self.settings = reward, settings
        # A second held-out reward scoring the same samples (rl.eval.gold): the reward-hacking watch's
        # reference when set; "" = none. Its per-prompt sums travel beside the reward's (Scored.gold).
        self.gold = gold
        self.tokenizer, self.vae, self.device = tokenizer, vae, device
        self.model_parts = model_parts  # the ModelParts whose scheduler config rollouts use (None: default UniPC)
        self.media, self.batch_size = media, batch_size
        self.latent_shape = tuple(latent_shape)  # one sample's (C, T, h, w), from models.media.latent_shape
        self._tokens: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        # A conditioned evaluation (image to video): every clip starts from the first frame of the
        # suite's given first frame of its caption at its seed (the shapes world's: frame 0 of the
        # ground-truth clip), held clean
        # as the pipeline holds it, whatever source the run trained from.
        if condition.is_conditioned and not media.is_video:
            raise ValueError("a conditioned evaluation needs clips (media with more than one frame)")
        self.condition_value = condition
        self.i2v = condition.is_conditioned  # the name eval.json and the verdict cache keep
        # Called after every sampler call of `sample` with (items sampled, items asked for): the
        # progress of `cosmos-rl eval`; None elsewhere (training's evaluations).
        self.on_batch: Callable[[int, int], None] | None = None
        if condition.is_conditioned and not suite.gives_frames:
            raise ValueError(f"a conditioned evaluation needs given frames, and the suite {suite.name!r} gives none")

    @classmethod
    def for_run(cls, config, parts, device: torch.device) -> "Evaluator":
        """The `[rl.eval]` evaluation of a run, sampling with `parts` (anything with .transformer,
        .vae and .tokenizer, e.g. a TrainableModel) in the run's suite (`config.run_suite`). A
        conditioned run (`[model.condition]`, e.g. I2V NFT) evaluates conditioned, as `cosmos-rl eval`
        of its run directory does: the task it trains. `[[rl.eval.rewards]]` score through reward
        services (`evaluation.served`) instead of rl.eval.reward."""
        cfg = config.rl.eval
        media = MediaSpec.from_model_config(config.model)
        suite = run_suite(config)
        captions, _ = eval_captions(cfg.prompts, cfg.per_task, suite)
        from cosmos_rl.evaluation.served import ServedRewards, eval_reward_name, manifest_terms

        # `[[rl.eval.rewards]]`: this process starts (or reaches) their services once, for the whole
        # run; the loopback ones are daemon threads that end with it.
        terms = manifest_terms(config)
        scorer = ServedRewards(terms, media, manifest=True) if terms else None
        return cls(
            captions, cfg.seeds, eval_reward_name(config), run_settings(config), scorer=scorer, tokenizer=parts.tokenizer, vae=parts.vae,
            media=media, latent_shape=latent_shape(media, parts.vae.config, parts.transformer.config),
            device=device, origin=f"rl.eval.prompts {cfg.prompts}" if cfg.prompts else "rl.eval",
            model_parts=getattr(parts, "parts", parts), condition=Condition.from_model_config(config.model).evaluated(), suite=suite,
            gold=cfg.gold,
        )

    def identity(self) -> dict:
        """Everything besides the network (and the code) that decides this evaluation's images and
        verdicts, as JSON: the prompts and their token ids (the tokenizer and template), the seeds,
        the sampler and the scheduler it steps, what a sample is, the batches (a packed batch
        differs from single samples by up to 1e-5), the conditioning, the reward and the device."""
        import hashlib
        import json

        from cosmos_rl.models.latent_keys import canonical_json

        mp = self.model_parts
        tokens = hashlib.sha256()
        for caption in self.captions:
            for ids in self._ids(caption):
                tokens.update(json.dumps(ids.tolist()).encode())
        scheduler = {name: value for name, value in dict(mp.scheduler.config).items() if not str(name).startswith("_")}
        media = self.media
        device = self.device.type + (f" {torch.cuda.get_device_name(self.device)}" if self.device.type == "cuda" else "")
        return {
            "prompts": hashlib.sha256(json.dumps(self.captions).encode()).hexdigest(), "n_prompts": len(self.captions),
            "seeds": self.seeds, "reward": self.reward, "sampler": self.settings.resolved(mp).as_json(),
            "scheduler": [type(mp.scheduler).__name__, hashlib.sha256(canonical_json(scheduler).encode()).hexdigest()],
            "native_flow_schedule": bool(mp.native_flow_schedule), "prompt_template": getattr(mp, "prompt_template", "chat"),
            "token_ids": tokens.hexdigest(), "media": [media.frames, media.height, media.width, media.fps],
            "latent_shape": list(self.latent_shape), "batch_size": self.batch_size, "i2v": self.i2v, "device": device,
            "suite": self.suite.name,
            # A served reward's own revisions (a model reward's: a hash of its weights), so changed weights miss the cache.
            **({"reward_revisions": self.scorer.revisions} if self.scorer is not None else {}),
        }  # fmt: skip

    # ------------------------------------------------------------------------------ sampling
    def noise(self, item: Item) -> torch.Tensor:
        from cosmos_rl.models.generate import noise

        return noise((1, *self.latent_shape), "eval", item.seed, item.caption, device=self.device)

    def _ids(self, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        from cosmos_rl.models.text import model_prompt_ids

        if caption not in self._tokens:
            # The model's own prompt template (e.g. the shapes base's `minimal`), as its training used.
            template = getattr(self.model_parts, "prompt_template", "chat")
            cond, uncond = model_prompt_ids(self.tokenizer, template, [caption], self.media)
            self._tokens[caption] = (cond[0].to(self.device), uncond[0].to(self.device))
        return self._tokens[caption]

    def first_frames(self, batch: Sequence[Item]) -> np.ndarray:
        """uint8 [N, H, W, 3]: the suite's given first frame of each item's caption at its seed."""
        return self.suite.given_frames([item.caption for item in batch], self.media, [item.seed for item in batch])

    def first_frame(self, item: Item) -> np.ndarray:
        """uint8 [H, W, 3]: the suite's given first frame of the item's caption at its seed."""
        return self.first_frames([item])[0]

    def given_frames(self, item: Item) -> np.ndarray:
        """uint8 [k, H, W, 3]: a condition's k > 1 leading frames of the ground-truth clip of the
        item's caption and seed. Suites give first frames; leading frames are the shapes worlds'
        ground-truth clips (a suite-level source of k frames is the world-model work's)."""
        from cosmos_rl.shapes.clips import render_clip

        clip = render_clip(item.caption, item.seed, self.media.size, self.media.frames)
        return clip[: self.condition_value.kind.given_frames]

    def condition(self, batch: Sequence[Item]) -> torch.Tensor | None:
        if not self.i2v:
            return None
        from cosmos_rl.models.generate import condition_latents

        if self.condition_value.kind.given_frames == 1:  # first frames [B, H, W, 3], as image to video gives them
            frames = torch.from_numpy(self.first_frames(batch))
        else:
            frames = torch.from_numpy(np.stack([self.given_frames(item) for item in batch]))
        return condition_latents(self.vae, frames.to(self.device))

    @torch.no_grad()
    def sample(self, transformer: torch.nn.Module, items: Sequence[Item]) -> np.ndarray:
        """uint8 [N, H, W, 3] images (clips: [N, F, H, W, 3]) of `items` (in order), `batch_size` per sampler call."""
        from cosmos_rl.dist.fsdp import gathered_while_sampling
        from cosmos_rl.models.generate import generate
        from cosmos_rl.models.text_kv import held_while_sampling

        # The network given, with the training rollouts' scheduler (a folder's own config) and this VAE.
        mp = self.model_parts
        parts = SimpleNamespace(transformer=transformer, vae=self.vae, scheduler=mp.scheduler, native_flow_schedule=mp.native_flow_schedule)
        out = []
        with gathered_while_sampling(transformer), held_while_sampling(transformer):
            for start in range(0, len(items), self.batch_size):
                batch = items[start : start + self.batch_size]
                ids = [self._ids(item.caption) for item in batch]
                _, pixels = generate(
                    parts, self.media, ([c for c, _ in ids], [u for _, u in ids]),
                    torch.cat([self.noise(item) for item in batch]), self.settings, condition=self.condition(batch),
                )  # fmt: skip
                out.append(pixels.numpy())
                if self.on_batch is not None:
                    self.on_batch(start + len(batch), len(items))
        return np.concatenate(out)

    def scored(
        self, transformer: torch.nn.Module, rank: int = 0, world: int = 1, keep: frozenset[int] = frozenset()
    ) -> Scored:
        """Rank `rank`'s share of the items, sampled and scored: its task and prompt totals, and the
        items in `keep` that it sampled (by item index) with their scores."""
        share = rank_share(self.items, rank, world)
        images = self.sample(transformer, [item for item, _ in share])
        counted = [(item, image) for (item, counts), image in zip(share, images) if counts]
        scores, partials = [], None
        if counted:
            captions = [item.caption for item, _ in counted]
            samples = np.stack([image for _, image in counted])
            if self.scorer is not None:
                scores, partials = self.scorer.score(samples, captions), None
            else:
                scores, partials = score_images(self.reward, samples, captions, self.suite)
        kept = {item.index: image for item, image in counted if item.index in keep}
        done = self.tally([item for item, _ in counted], scores, partials, kept)
        if not self.gold:
            return done
        gold = PromptTotals.empty(len(self.captions))
        if counted:
            values, _ = score_images(self.gold, np.stack([image for _, image in counted]), captions, self.suite)
            for (item, _), value in zip(counted, values):
                gold.add(item.prompt, value, None)
        return replace(done, gold=gold)

    def tally(
        self, items: Sequence[Item], scores: Sequence[float], partials: Sequence[float] | None, images: dict[int, np.ndarray]
    ) -> Scored:
        """The totals of `items` scored `scores` (and `partials`), added in item order, and the items
        of `images` (by item index) kept with their scores: what `scored` returns, also when the
        verdicts come from the evaluation cache (`evaluation.verdict_cache`), so both add alike."""
        totals, prompts, kept = Totals.empty(groups_of(self.suite)), PromptTotals.empty(len(self.captions)), {}
        for index, item in enumerate(items):
            partial = partials[index] if partials else None
            totals.add(self.groups[item.caption], scores[index], partial)
            prompts.add(item.prompt, scores[index], partial)
            if item.index in images:
                kept[item.index] = Sample(images[item.index], scores[index], partial)
        return Scored(totals, prompts, kept, tuple(scores), None if partials is None else tuple(partials))

    def totals(
        self, transformer: torch.nn.Module, rank: int = 0, world: int = 1, keep: frozenset[int] = frozenset()
    ) -> tuple[Totals, dict[int, np.ndarray]]:
        """`scored` as (its task totals, the kept items' images)."""
        done = self.scored(transformer, rank, world, keep)
        return done.totals, {index: sample.image for index, sample in done.kept.items()}

    def tasks_of(self) -> list[str]:
        """The task of each prompt, in prompt order."""
        return [self.groups[caption] for caption in self.captions]

    def scores(self, totals: Totals, prompts: PromptTotals) -> EvalScores:
        """The scores of summed totals, with their bootstrap intervals over prompts."""
        return with_intervals(totals.scores(self.reward), prompts, self.tasks_of())

    def evaluate(self, transformer: torch.nn.Module) -> EvalScores:
        """Every item in this process (one rank of one)."""
        done = self.scored(transformer)
        return self.scores(done.totals, done.prompts)


@dataclass(frozen=True)
class Sample:
    """One scored item kept for the grid."""

    image: np.ndarray  # uint8 [H, W, 3], or a clip [F, H, W, 3]
    score: float
    partial: float | None


@dataclass(frozen=True)
class Scored:
    totals: Totals
    prompts: PromptTotals
    kept: dict[int, Sample]
    # Each counted item's verdict, in the order of the share's counted items (all items, in order,
    # for one process): what the evaluation cache keeps.
    scores: tuple[float, ...] = ()
    partials: tuple[float, ...] | None = None
    gold: PromptTotals | None = None  # the rl.eval.gold reward's per-prompt sums (Evaluator.gold), else None


def evaluate_ranks(
    evaluator: Evaluator, transformer: torch.nn.Module, ranks: Sequence[int], world: int,
    mean: Callable[[list[dict[str, float]]], dict[str, float]],
) -> dict[str, float]:  # fmt: skip
    """The `eval/` metrics of a group (with the watch's per-prompt scores, `EvalScores.watched`): each rank this process plays samples its share, and `mean`
    (the group's metric mean, e.g. an NFT collectives' `mean`) averages the totals over the group;
    times `world` that is their sum."""
    done = [evaluator.scored(transformer, rank, world) for rank in ranks]
    total = Totals.from_dict({key: value * world for key, value in mean([d.totals.as_dict() for d in done]).items()}, groups_of(evaluator.suite))
    # The prompt sums in a second mean, so the task sums above are reduced exactly as before they existed.
    summed = {key: value * world for key, value in mean([d.prompts.as_dict() for d in done]).items()}
    metrics = evaluator.scores(total, PromptTotals.from_dict(summed, len(evaluator.captions))).watched()
    if evaluator.gold:  # a third mean: the gold reward's prompt sums
        gold = {key: value * world for key, value in mean([d.gold.as_dict() for d in done]).items()}
        metrics.update(gold_metrics(PromptTotals.from_dict(gold, len(evaluator.captions)), evaluator.tasks_of()))
    return metrics


def evaluate_all_reduce(evaluator: Evaluator, transformer: torch.nn.Module, rank: int, world: int, counted: bool = True) -> dict[str, float]:
    """The `eval/` metrics (with the watch's per-prompt scores, `EvalScores.watched`) when every rank of a torch.distributed world (or one process) calls this:
    each samples its share, then one all-reduce sums the totals (on the evaluator's device: NCCL
    reduces CUDA tensors only). `rank`/`world`: the share (a data-parallel rank with context
    parallelism); `counted` False: another rank sampled the same share and is summed instead (this
    rank adds zeros), so a context group's share counts once."""
    done = evaluator.scored(transformer, rank, world)
    # Two all-reduces: the task sums alone, exactly as before the prompt sums existed, then the prompt sums.
    totals = Totals.from_dict(_summed(done.totals.as_dict(), evaluator.device, counted), groups_of(evaluator.suite))
    prompts = PromptTotals.from_dict(_summed(done.prompts.as_dict(), evaluator.device, counted), len(evaluator.captions))
    metrics = evaluator.scores(totals, prompts).watched()
    if evaluator.gold:  # a third all-reduce: the gold reward's prompt sums
        gold = PromptTotals.from_dict(_summed(done.gold.as_dict(), evaluator.device, counted), len(evaluator.captions))
        metrics.update(gold_metrics(gold, evaluator.tasks_of()))
    return metrics


def _summed(flat: dict[str, float], device: torch.device, counted: bool = True) -> dict[str, float]:
    from cosmos_rl.dist.world import process_group_active

    keys = sorted(flat)
    vector = torch.tensor([flat[k] if counted else 0.0 for k in keys], dtype=torch.float64, device=device)
    if process_group_active():
        import torch.distributed as dist

        dist.all_reduce(vector, op=dist.ReduceOp.SUM)
    return dict(zip(keys, vector.tolist()))
