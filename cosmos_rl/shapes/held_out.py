"""Held-out shapes scores of a model, with the shapes verifier as the judge (used by the base build).

Each held-out prompt of `split_prompts(0)` (319 prompts) is sampled once per seed in `seeds`, so
two seeds give 638 scored images (128 would leave +-0.05 of noise on the score). Sample `i` of seed
`s` starts from noise drawn from `derive_seed("shapes-eval", s, i)`, so a score is reproducible
and two models are compared on the same noise. Scores follow `docs/eval.md`: per task the mean,
overall the unweighted mean over tasks, strict (everything right, nothing extra) and partial.
"""

from __future__ import annotations

from typing import Iterable

import torch

from cosmos_rl.models.build import ModelParts
from cosmos_rl.models.media import MediaSpec, latent_shape

SHAPES_MEDIA = MediaSpec.image(32)  # the shapes world's images


def _noise(seed: int, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    from cosmos_rl.models.generate import noise

    return noise(shape, "shapes-eval", seed, index)


@torch.no_grad()
def sample_images(parts: ModelParts, prompts: list[str], noise: torch.Tensor, *, guidance: float, steps: int, shift: float,
                  media: MediaSpec = SHAPES_MEDIA, batch: int = 128) -> "torch.Tensor":
    """uint8 images [N, H, W, 3] for `prompts` from `noise` [N, C, 1, h, w] (UniPC, native CFG)."""
    from cosmos_rl.models.packing import velocity
    from cosmos_rl.models.sampling import sample_latents
    from cosmos_rl.models.text import model_prompt_ids
    from cosmos_rl.models.vae import decode_latents

    out = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        cond, uncond = model_prompt_ids(parts.tokenizer, parts.prompt_template, chunk, media)
        x0, _ = sample_latents(
            lambda x, s, ids: velocity(parts.transformer, x, s, ids),
            noise[start : start + len(chunk)], cond, uncond, steps, shift, guidance,
        )
        images = decode_latents(parts.vae, x0)
        # float32 x * 255, rounded: not data.pixels.to_uint8 (float64), which puts ~6e-6 of the
        # pixels one level apart and so could move the held-out scores the base build recorded.
        out.append(images.mul(255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1))
    return torch.cat(out)


def held_out_scores(parts: ModelParts, *, seeds: Iterable[int] = (0, 1), guidance: float = 3.0, steps: int = 20,
                    shift: float = 1.0, media: MediaSpec = SHAPES_MEDIA, split_seed: int = 0) -> dict:
    """{"strict", "partial": overall scores, "strict_by_task", "partial_by_task", "images", sampler settings}."""
    from cosmos_rl.shapes import split_prompts

    seeds = list(seeds)
    held_out = split_prompts(split_seed).held_out_captions()
    shape = latent_shape(media, parts.vae.config, parts.transformer.config)
    prompts, noise = [], []
    for seed in seeds:
        for index, prompt in enumerate(held_out):
            prompts.append(prompt)
            noise.append(_noise(seed, index, shape))
    parts.transformer.eval()
    parts.vae.eval()
    images = sample_images(parts, prompts, torch.stack(noise), guidance=guidance, steps=steps, shift=shift, media=media)
    return {**score_images(images.numpy(), prompts), "sampler": {"steps": steps, "shift": shift, "guidance": guidance, "seeds": seeds}}


def score_images(images, prompts: list[str]) -> dict:
    """Overall and per-task strict and partial scores of uint8 images [N, H, W, 3], one per prompt."""
    from cosmos_rl.shapes import overall_score, scores_by_task, verify

    verdicts = verify(images, prompts)
    strict = scores_by_task(prompts, [v.strict for v in verdicts])
    partial = scores_by_task(prompts, [v.partial for v in verdicts])
    return {
        "strict": round(overall_score(strict), 4),
        "partial": round(overall_score(partial), 4),
        "strict_by_task": {k: round(v, 4) for k, v in strict.items()},
        "partial_by_task": {k: round(v, 4) for k, v in partial.items()},
        "images": len(prompts),
    }
