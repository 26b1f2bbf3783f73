"""Sampling and scoring an evaluation's images with one model; the same images on every call.

Each item's starting noise comes from its own generator, seeded by (the label "eval", the seed
index, the caption) on the CPU (`models.generate.noise`): it does not depend on the run's job.seed,
the device, the batch an item lands in or the rank that samples it, so two runs (and a run and its
base) are compared on identical noise. Items are sampled in batches of `batch_size` by
`models.generate.generate` (as the NFT rollout is) and scored in-process by a built-in reward
(`evaluation.scores`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import torch

from cosmos_rl.evaluation.prompts import Item, eval_captions, make_items, rank_share
from cosmos_rl.evaluation.scores import EvalScores, Totals, caption_groups, score_images
from cosmos_rl.config.sampler import DEFAULT_BATCH, run_settings
from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.models.media import MediaSpec, latent_shape


class Evaluator:
    """The items of one evaluation and the frozen parts (tokenizer, VAE) that sample them."""

    def __init__(
        self, captions: Sequence[str], seeds: int, reward: str, settings: SamplerSettings, *,
        tokenizer, vae, media: MediaSpec, latent_shape: tuple[int, ...], device: torch.device,
        batch_size: int = DEFAULT_BATCH, origin: str = "the evaluation prompts", model_parts=None,
    ):  # fmt: skip
        self.groups = caption_groups(captions, reward, origin)
        self.captions = list(captions)
        self.items = make_items(self.captions, seeds)
        self.reward, self.settings = reward, settings
        self.tokenizer, self.vae, self.device = tokenizer, vae, device
        self.model_parts = model_parts  # the ModelParts whose scheduler config rollouts use (None: default UniPC)
        self.media, self.batch_size = media, batch_size
        self.latent_shape = tuple(latent_shape)  # one sample's (C, T, h, w), from models.media.latent_shape
        self._tokens: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def for_run(cls, config, parts, device: torch.device) -> "Evaluator":
        """The `[rl.eval]` evaluation of a run, sampling with `parts` (anything with .transformer,
        .vae and .tokenizer, e.g. a TrainableModel)."""
        cfg = config.rl.eval
        captions, _ = eval_captions(cfg.prompts, cfg.per_task)
        media = MediaSpec.from_model_config(config.model)
        return cls(
            captions, cfg.seeds, cfg.reward, run_settings(config), tokenizer=parts.tokenizer, vae=parts.vae,
            media=media, latent_shape=latent_shape(media, parts.vae.config, parts.transformer.config),
            device=device, origin=f"rl.eval.prompts {cfg.prompts}" if cfg.prompts else "rl.eval",
            model_parts=getattr(parts, "parts", parts),
        )

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

    @torch.no_grad()
    def sample(self, transformer: torch.nn.Module, items: Sequence[Item]) -> np.ndarray:
        """uint8 [N, H, W, 3] images of `items` (in order), `batch_size` per sampler call."""
        from cosmos_rl.dist.fsdp import gathered_while_sampling
        from cosmos_rl.models.generate import generate

        # The network given, with the training rollouts' scheduler (a folder's own config) and this VAE.
        mp = self.model_parts
        parts = SimpleNamespace(transformer=transformer, vae=self.vae, scheduler=mp.scheduler, native_flow_schedule=mp.native_flow_schedule)
        out = []
        with gathered_while_sampling(transformer):
            for start in range(0, len(items), self.batch_size):
                batch = items[start : start + self.batch_size]
                ids = [self._ids(item.caption) for item in batch]
                _, pixels = generate(
                    parts, self.media, ([c for c, _ in ids], [u for _, u in ids]),
                    torch.cat([self.noise(item) for item in batch]), self.settings,
                )  # fmt: skip
                out.append(pixels.numpy())
        return np.concatenate(out)

    def totals(
        self, transformer: torch.nn.Module, rank: int = 0, world: int = 1, keep: frozenset[int] = frozenset()
    ) -> tuple[Totals, dict[int, np.ndarray]]:
        """Rank `rank`'s share of the items, sampled and scored: its Totals and the images of the
        items in `keep` that it sampled (by item index)."""
        share = rank_share(self.items, rank, world)
        images = self.sample(transformer, [item for item, _ in share])
        counted = [(item, image) for (item, counts), image in zip(share, images) if counts]
        totals = Totals()
        if counted:
            captions = [item.caption for item, _ in counted]
            scores, partials = score_images(self.reward, np.stack([image for _, image in counted]), captions)
            for index, (item, _) in enumerate(counted):
                totals.add(self.groups[item.caption], scores[index], partials[index] if partials else None)
        return totals, {item.index: image for item, image in counted if item.index in keep}

    def evaluate(self, transformer: torch.nn.Module) -> EvalScores:
        """Every item in this process (one rank of one)."""
        return self.totals(transformer)[0].scores(self.reward)


def evaluate_ranks(
    evaluator: Evaluator, transformer: torch.nn.Module, ranks: Sequence[int], world: int,
    mean: Callable[[list[dict[str, float]]], dict[str, float]],
) -> dict[str, float]:  # fmt: skip
    """The `eval/` metrics of a group: each rank this process plays samples its share, and `mean`
    (the group's metric mean, e.g. an NFT collectives' `mean`) averages the totals over the group;
    times `world` that is their sum."""
    own = [evaluator.totals(transformer, rank, world)[0].as_dict() for rank in ranks]
    total = Totals.from_dict({key: value * world for key, value in mean(own).items()})
    return total.scores(evaluator.reward).metrics()


def evaluate_all_reduce(evaluator: Evaluator, transformer: torch.nn.Module, rank: int, world: int) -> dict[str, float]:
    """The `eval/` metrics when every rank of a torch.distributed world (or one process) calls this:
    each samples its share, then one all-reduce sums the totals (on the evaluator's device: NCCL
    reduces CUDA tensors only)."""
    from cosmos_rl.dist.world import process_group_active

    flat = evaluator.totals(transformer, rank, world)[0].as_dict()
    keys = sorted(flat)
    vector = torch.tensor([flat[k] for k in keys], dtype=torch.float64, device=evaluator.device)
    if process_group_active():
        import torch.distributed as dist

        dist.all_reduce(vector, op=dist.ReduceOp.SUM)
    return Totals.from_dict(dict(zip(keys, vector.tolist()))).scores(evaluator.reward).metrics()
