"""`cosmos-rl pairs mine TARGET --reward NAME --prompts FILE --samples K --out DIR`.

For every row of the prompt file the model (a run's newest checkpoint, a diffusers folder or
`preset:NAME`, opened as `cosmos-rl eval` opens it) samples K images with its own sampler
settings, a reward scores them (a built-in one in-process, or any reward a run trains on through
reward services: `--reward KIND=FOLDER`, `--reward-url`, several weighted; `evaluation.served`),
and the best and the worst become one preference pair
(`select.best_vs_worst`; a row whose K samples all score the same is dropped). Pairs go to
webdataset shards (`shards.PairShardWriter`) with both scores in each pair's JSON, and
`mine.json` records what was mined with what.

A target that makes clips (a run with `model.num_frames` above 1, or a bare model given
`--frames F`) samples K text-to-video clips per row instead, ranked by a clip reward or by an image
reward frame by frame (`scoring`), and the pairs are mp4 clip pairs a video DPO run reads.

Each sample's starting noise comes from a generator seeded by ("mine", --seed, the sample's
index, its caption) on the CPU, so the same command writes the same pairs on any device or batch
size, and a duplicated prompt row gets fresh samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from cosmos_rl.commands.mining.shards import SUMMARY_FILE
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec

ROWS_PER_CHUNK = 64  # prompt rows sampled, scored and written per round (progress granularity)
CLIP_ROWS_PER_CHUNK = 8  # the same for clips, each F times an image's work
# A row's pair is only its best and worst sample, so more samples sharpen the extremes slowly while
# each one costs a full sampling; past this a K is a typo (10**30 would allocate K noise items per row).
SAMPLES_MAX = 1024


def check_options(samples: int, batch_size: int, per_shard: int) -> None:
    """The counts; the reward is judged once the target's media is known (`scoring.check_reward`)."""
    if samples < 2:
        raise UserError(f"--samples: must be >= 2 (got {samples}); a pair is the best and the worst of K samples")
    if samples > SAMPLES_MAX:
        raise UserError(f"--samples: at most {SAMPLES_MAX} (got {samples}): a pair keeps only the best and the worst of the K "
                        "samples of a row, and each sample costs a full sampling; use e.g. 4 to 16")
    if per_shard < 1:
        raise UserError(f"--per-shard: must be >= 1 (got {per_shard})")
    if batch_size < 1:
        raise UserError(f"--batch-size: must be >= 1 (got {batch_size})")


def run_mine(
    target: str, *, reward: str | Sequence[str], prompts: Path, samples: int, out_dir: Path, seed: int = 0,
    batch_size: int = 32, per_shard: int = 1000, device: str = "auto",
    warn: Callable[[str], None] = lambda line: None, progress: Callable[[int, int], None] = lambda done, total: None,
    sample_steps: int | None = None, guidance: float | None = None, step: int | None = None,
    frames: int | None = None, frame_reduce: str | None = None, reward_url: str | None = None,
    reward_weights: Sequence[str] = (), reward_token_env: str | None = None, image_size: int | None = None,
) -> dict:  # fmt: skip
    """Mine pairs into `out_dir` and return the summary written to `<out_dir>/mine.json`.

    `sample_steps` / `guidance` replace the target's own sampler settings (as `cosmos-rl eval`'s
    flags do); None keeps them. `frames` is a bare model's clip length (a run samples its own);
    `frame_reduce` lets an image reward score clips frame by frame. `reward` may be a list of
    `--reward` items: with a model reward's folder (`pickscore=FOLDER`), `reward_url`,
    `reward_weights` or several items the samples are ranked by the weighted sum of rewards scored
    through services as a run's are (`evaluation.served`). An episode suite's reward
    (`pusht_forward_partial`) mines a world model's predicted futures of the prompt file's window
    keys in forward dynamics instead (`mining.world`), at `image_size` for a bare model."""
    check_options(samples, batch_size, per_shard)
    from cosmos_rl.evaluation.served import ServedRewards, label, served_terms

    items = [reward] if isinstance(reward, str) else list(reward)
    world = _episode_suite(items)
    if world is not None:  # a world model's predicted futures of window keys (mining.world)
        return _mine_world(world, items, target, prompts=prompts, samples=samples, out_dir=out_dir, seed=seed, batch_size=batch_size,
                           per_shard=per_shard, device=device, progress=progress, sample_steps=sample_steps, guidance=guidance,
                           step=step, frames=frames, image_size=image_size, frame_reduce=frame_reduce, reward_url=reward_url,
                           reward_weights=reward_weights)  # fmt: skip
    if image_size is not None:
        raise UserError(f"--image-size {image_size}: sizes a world model's window clips (an episode suite's reward, e.g. pusht_forward_partial); "
                        "a text-to-image target samples its own size: drop --image-size")  # fmt: skip
    terms = served_terms(items, reward_url, reward_weights, reward_token_env, frame_reduce)
    reward = label(terms) if terms is not None else (items[0] if items else "")
    from cosmos_rl.commands.evaluate import check_frames, check_out_dir, check_prompts_file, check_sampler_overrides

    check_frames(frames)
    check_out_dir(out_dir)
    check_prompts_file(prompts)

    check_sampler_overrides(sample_steps, guidance)
    from cosmos_rl.evaluation.target import open_target, target_media

    t = open_target(target, step=step, media=target_media(target, None, frames), out_dir=out_dir, frames=frames)
    video = t.media.is_video
    from cosmos_rl.commands.mining.scoring import check_reward, ranks_by, scoring_suite, unscorable_rows

    if terms is None:
        check_reward(reward, t.media, frame_reduce, f"TARGET {target!r}")
    elif frame_reduce is not None and not video:
        raise UserError(f"--frame-reduce {frame_reduce}: TARGET {target!r} makes images (1 frame), so no clip is scored "
                        "frame by frame; drop --frame-reduce")  # fmt: skip
    from cosmos_rl.data.prompt_file import load_prompts
    from cosmos_rl.evaluation.prompts import held_out_captions, overlap
    from cosmos_rl.evaluation.scores import caption_groups, uses_verifier

    captions = load_prompts(prompts)
    if not captions:
        raise UserError(f"--prompts {prompts}: the file holds no prompt; pass a file with at least one")
    # Clips judged by an image suite's verifier frame by frame still carry clip captions: their tasks are the clip suite's.
    suite = scoring_suite(reward, t.media.frames)
    grouped_by = suite.default_reward if uses_verifier(reward) else reward
    groups = caption_groups(captions, grouped_by, f"--prompts {prompts}", suite)
    skipped = unscorable_rows(reward, t.media, frame_reduce, captions)
    if skipped:
        warn(f"{len(skipped)} of the {len(captions)} prompt rows are colour changes (e.g. {captions[skipped[0]]!r}), which have no "
             f"static part for {reward} to score each frame against; they are skipped")  # fmt: skip
        if len(skipped) == len(captions):
            raise UserError(f"--prompts {prompts}: every row is a colour change, which {reward} cannot score frame by frame; "
                            f"use {next(r.name for r in suite.rewards if r.part == 'partial' and not r.given_frame)}, or other prompts")  # fmt: skip
    rows_of = sorted(set(range(len(captions))) - set(skipped))  # the file's row of each mined caption
    captions = [captions[row] for row in rows_of]
    if uses_verifier(reward):
        seen = overlap(held_out_captions(suite, 0), captions, suite)
        if seen:
            warn(f"{len(seen)} of the prompt rows are held-out evaluation prompts (e.g. {seen[0]!r}): a model trained on "
                 "these pairs is then evaluated on what it trained on")  # fmt: skip
    from cosmos_rl.commands.mining.shards import PairShardWriter

    try:
        writer = PairShardWriter(out_dir, per_shard, t.media.fps if video else None)  # refuses an old set before any sampling
    except OSError as exc:  # e.g. a parent that is a file, or no permission
        raise UserError(f"--out {str(out_dir)!r}: cannot create the folder ({exc.strerror}); pass a writable folder") from None
    from cosmos_rl.dist.world import pick_device

    where = pick_device(device)
    # A served reward is started and checked (its folder loaded, its service's /info read) before the target loads.
    served = ServedRewards(terms, t.media) if terms is not None else None
    try:
        model = t.load(where)
        t.settings = t.settings.replaced(sample_steps, guidance)
        sampler = _sampler(t, model, captions, samples, grouped_by, seed, where, batch_size, suite)
        key = ranks_by(reward)
        n, ties, kept = len(captions), 0, []
        progress(0, n)
        with model.policy() as network:
            chunk = CLIP_ROWS_PER_CHUNK if video else ROWS_PER_CHUNK
            for first in range(0, n, chunk):
                rows = range(first, min(first + chunk, n))
                items = [sampler.items[k * n + row] for row in rows for k in range(samples)]
                images = sampler.sample(network, items)
                captions_of = [item.caption for item in items]
                scores, partials = (served.score(images, captions_of), None) if served is not None else _scores(reward, images, captions_of, frame_reduce)
                for offset, row in enumerate(rows):
                    span = slice(offset * samples, (offset + 1) * samples)
                    ranked = (partials if key == "partial" else scores)[span]
                    pick = _best_vs_worst(ranked)
                    if pick is None:
                        ties += 1
                        continue
                    w, l = pick
                    meta = {
                        "id": f"mine-s{seed}-r{rows_of[row]:06d}", "prompt": captions[row], "task": groups[captions[row]],
                        "reward": reward, "winner_score": ranked[w], "loser_score": ranked[l], "scores": list(ranked),
                        "winner_sample": w, "loser_sample": l, **({"frame_reduce": frame_reduce} if frame_reduce else {}),
                    }  # fmt: skip
                    if partials is not None and key == "score":
                        meta["partials"] = partials[span]
                    if partials is not None and key == "partial":
                        meta["strict"] = scores[span]
                    writer.add(meta, images[span][w], images[span][l])
                    kept.append(ranked[w] - ranked[l])
                progress(rows.stop, n)
        paths = writer.close()
        summary = {
            "target": t.label, "kind": t.kind, "step": t.step, "reward": reward, "ranked_by": key,
            "prompts": str(prompts), "rows": n, "samples": samples, "seed": seed,
            "pairs": len(kept), "ties_dropped": ties, "rows_skipped": len(skipped), "mean_margin": (sum(kept) / len(kept)) if kept else None,
            "sampler": t.settings.resolved(model.model_parts).as_json(), "image_size": t.media.size_json(),
            "shards": [str(p) for p in paths],
            # Added with clips, after every older key: what a sample is, and how an image reward scored clips.
            "frames": t.media.frames, "fps": t.media.fps if video else None, "frame_reduce": frame_reduce,
            # Added with served rewards: each reward scored through a service (folder or url), its weight and revision; null = in-process.
            "rewards": served.describe() if served is not None else None,
        }  # fmt: skip
        if not kept:
            finer = "score with another reward" if served is not None else _finer(reward, t.media, frame_reduce)
            raise UserError(f"every one of the {n} prompt rows tied ({samples} samples scored alike under {reward}): "
                            f"no pair written; raise --samples or {finer}")  # fmt: skip
        Path(out_dir, SUMMARY_FILE).write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return summary
    finally:
        if served is not None:
            served.close()


def _episode_suite(items: Sequence[str]):
    """The episode suite whose reward (an item naming a built-in reward, no folder) ranks, or None."""
    from cosmos_rl.commands.mining.scoring import reward_suite

    for item in items:
        if "=" in item:
            continue
        suite = reward_suite(item)
        if suite is not None and suite.is_episodic:
            return suite
    return None


def _mine_world(suite, items, target: str, *, prompts: Path, samples: int, out_dir: Path, seed: int, batch_size: int, per_shard: int,
                device: str, progress, sample_steps, guidance, step, frames, image_size, frame_reduce, reward_url, reward_weights) -> dict:  # fmt: skip
    from cosmos_rl.commands.evaluate import IMAGE_SIZE_MAX, check_frames, check_out_dir, check_prompts_file, check_sampler_overrides
    from cosmos_rl.commands.mining.world import check_world_options, run_world_mine
    from cosmos_rl.evaluation.target import open_target, target_media

    reward = next(item for item in items if "=" not in item and suite.reward(item) is not None)
    check_world_options(reward, items, reward_url, reward_weights, frame_reduce)
    if image_size is not None and not 1 <= image_size <= IMAGE_SIZE_MAX:
        raise UserError(f"--image-size: must be in [1, {IMAGE_SIZE_MAX}] (got {image_size}); the Push-T world renders at 96 (its native size)")
    check_frames(frames)
    check_out_dir(out_dir)
    check_prompts_file(prompts)
    check_sampler_overrides(sample_steps, guidance)
    media = target_media(target, image_size, frames)
    t = open_target(target, step=step, media=media, out_dir=out_dir, frames=frames)
    if t.kind == "model" and media is None:
        t.media = suite.media  # a model folder given no size samples what the suite judges
    t.settings = t.settings.replaced(sample_steps, guidance)
    return run_world_mine(t, suite, reward, prompts=prompts, samples=samples, out_dir=out_dir, seed=seed, batch_size=batch_size,
                          per_shard=per_shard, device=device, progress=progress)


def _finer(reward: str, media: MediaSpec, frame_reduce: str | None) -> str:
    """What to rank by when every row tied: partial credit (the reward's suite's partial reward; the
    shapes suite's for a weight-free one), and for clips the image verifier frame by frame (the video
    verifier gives 0 to every clip of a model that does not yet draw the motion)."""
    from cosmos_rl.commands.mining.scoring import reward_suite
    from cosmos_rl.suites import registry as suites

    def partial_of(suite) -> str | None:
        return next((r.name for r in suite.rewards if r.part == "partial" and not r.given_frame), None)

    owner = reward_suite(reward)
    image_suite = owner if owner is not None and not owner.judges_clips else None
    if image_suite is None:
        image_suite = suites.get(owner.frame_suite) if owner is not None and owner.frame_suite else suites.for_media(clips=False)
    image_partial = partial_of(image_suite)
    frame_by_frame = f"score frame by frame (--reward {image_partial} --frame-reduce mean)"
    if not media.is_video or frame_reduce is not None:
        finer = f"{image_partial}" + (f" --frame-reduce {frame_reduce}" if frame_reduce else "")
        return f"use a finer reward (e.g. {finer})" if reward != image_partial else "mine a model whose samples it tells apart"
    clip_partial = partial_of(owner) if owner is not None and owner.judges_clips else None
    return (f"use {clip_partial}, or " if clip_partial and reward != clip_partial else "") + frame_by_frame


def _best_vs_worst(scores):
    from cosmos_rl.commands.mining.select import best_vs_worst

    return best_vs_worst(scores)


def _scores(reward: str, samples, captions, frame_reduce: str | None):
    from cosmos_rl.commands.mining.scoring import score_samples

    return score_samples(reward, samples, captions, frame_reduce)


def _sampler(t, model, captions, samples: int, grouped_by: str, seed: int, device, batch_size: int, suite):
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.models.generate import noise
    from cosmos_rl.core.media import latent_shape

    class MineSampler(Evaluator):
        def noise(self, item):  # by the sample's own index: duplicated rows get fresh noise
            return noise((1, *self.latent_shape), "mine", seed, item.index, item.caption, device=self.device)

    return MineSampler(
        captions, samples, grouped_by, t.settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae, media=t.media,
        latent_shape=latent_shape(t.media, model.parts.vae.config, model.parts.transformer.config), device=device, batch_size=batch_size,
        origin="--prompts", model_parts=model.model_parts, suite=suite,
    )  # fmt: skip
