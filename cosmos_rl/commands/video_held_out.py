"""Held-out scores of a video model on the moving-shapes world, as `cosmos-rl eval` computes them.

Every held-out prompt of `split_motion_prompts(0)` (319) under `seeds` noise seeds, sampled with
eval's default sampler and judged by the video verifier through `evaluation.Evaluator` (the same
noise, prompts and scoring as `cosmos-rl eval preset:shapes_video --per-task 0 --seeds N`), text to
video and image to video (each clip conditioned on the first frame of its ground-truth clip).
"""

from __future__ import annotations

from cosmos_rl.core.condition import FIRST_FRAME, Condition
from cosmos_rl.models.build import ModelParts


def held_out_video_scores(parts: ModelParts, *, seeds: int = 4, frames: int = 9, side: int = 32) -> dict:
    """{"t2v": {...}, "i2v": {...}}, each {"strict", "partial", "strict_interval", "strict_by_task",
    "partial_by_task", "clips", "sampler"}."""
    import torch

    from cosmos_rl.config.sampler import default_settings
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.evaluation.prompts import held_out_captions
    from cosmos_rl.suites import registry as suites
    from cosmos_rl.core.media import MediaSpec, latent_shape

    media = MediaSpec(frames=frames, height=side, width=side)
    suite = suites.get("shapes_video")
    captions = held_out_captions(suite, 0)
    settings = default_settings().resolved(parts)
    out = {}
    parts.transformer.eval()
    parts.vae.eval()
    for mode in ("t2v", "i2v"):
        evaluator = Evaluator(
            captions, seeds, "shapes_video_strict", settings, tokenizer=parts.tokenizer, vae=parts.vae, media=media,
            latent_shape=latent_shape(media, parts.vae.config, parts.transformer.config), device=torch.device("cpu"),
            model_parts=parts, condition=Condition(kind=FIRST_FRAME, source="shapes_video") if mode == "i2v" else Condition(), suite=suite,
        )  # fmt: skip
        scores = evaluator.evaluate(parts.transformer)
        out[mode] = {
            "strict": round(scores.score, 4),
            "partial": round(scores.score_partial, 4),
            "strict_interval": [round(v, 4) for v in scores.intervals.overall],
            "strict_by_task": {k: round(v, 4) for k, v in scores.tasks.items()},
            "partial_by_task": {k: round(v, 4) for k, v in (scores.tasks_partial or {}).items()},
            "clips": scores.n_images,
            "sampler": settings.as_json(),
        }
    return out
