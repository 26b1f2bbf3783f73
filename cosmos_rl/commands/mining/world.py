"""`cosmos-rl pairs mine TARGET --reward pusht_forward_partial --prompts KEYS.txt`: preference pairs of
predicted futures for a world model in forward dynamics (docs/world_training.md "DPO in forward dynamics").

Each prompt row is a training-window key of the reward's episode suite (`pusht window seed=1
task=planner episode=3 start=8 length=30`, `cosmos_rl/pusht/windows.py`). For every key the target
samples K futures exactly as `cosmos-rl eval --suite pusht --condition forward_dynamics` samples a
window (`evaluation.world.WorldEvaluator.sample`, the same code: frame 0 as the clean latent frame 0,
the window's true action rows clean, the pipeline's structured action caption of its task); only the
noise stream is mining's own (("mine-world", --seed, sample k, the key) on the CPU). The suite's
verifier judges each clip against the key's true states (frame 0 given), as the rewards
`pusht_forward_partial` / `pusht_forward_strict` do; the reward named ranks (partial credit or
all-or-nothing) and the other is recorded. The best and the worst clip of a key make the pair
(`select.best_vs_worst`: a key whose K clips all score the same is dropped and counted), written
as mp4 clip pairs (`shards.PairShardWriter`) whose `prompt` is the key: the DPO run rebuilds frame 0
and the action rows from it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

from cosmos_rl.core.errors import UserError

ROWS_PER_CHUNK = 8  # keys sampled, judged and written per round (progress granularity)
MODE = "forward_dynamics"  # the mode the episode suites' rewards judge


def check_world_options(reward: str, items: Sequence[str], reward_url, reward_weights, frame_reduce) -> None:
    """An episode suite's reward ranks alone, in-process: no service, weights or reducer; and one that
    judges forward dynamics (a policy-mode reward executes generated actions, which mining has none of)."""
    from cosmos_rl.suites import registry

    suite = registry.reward_owner(reward)
    if suite is not None and suite.reward(reward).actions:
        judges = " or ".join(r.name for r in suite.rewards if not r.actions)
        raise UserError(f"--reward {reward}: executes a policy's generated action rows, and pairs mine samples {MODE} (the key's "
                        f"true actions given); use {judges}")  # fmt: skip
    if len(items) > 1 or reward_url or reward_weights:
        raise UserError(f"--reward {reward}: judges a world model's clips against the window its key names, in-process; mine with "
                        "it alone (drop the other --reward items, --reward-url and --reward-weight)")  # fmt: skip
    if frame_reduce is not None:
        raise UserError(f"--frame-reduce {frame_reduce}: plays no part: {reward} judges whole clips against their window; drop --frame-reduce")


def read_keys(prompts: Path, suite, media) -> list[str]:
    """The keys of the prompt file, each checked against the suite's grammar; a UserError naming file:line."""
    from cosmos_rl.data.prompt_file import read_prompt_rows

    rows, problems = read_prompt_rows(prompts)
    if problems:
        raise problems[0]
    if not rows:
        raise UserError(f"--prompts {prompts}: the file holds no key; write training-window keys with python -m cosmos_rl.{suite.name} windows")
    for row in rows:
        try:
            suite.window(row.prompt, media, check_only=True)
        except ValueError as exc:
            raise UserError(f"--prompts {prompts}:{row.line}: the reward's suite {suite.name} mines {suite.title} training-window keys ({exc}); "
                            f"write them with python -m cosmos_rl.{suite.name} windows") from None  # fmt: skip
    return [row.prompt for row in rows]


def run_world_mine(
    t, suite, reward: str, *, prompts: Path, samples: int, out_dir: Path, seed: int, batch_size: int, per_shard: int,
    device: str, progress: Callable[[int, int], None],
) -> dict:  # fmt: skip
    """Mine the opened target `t` (`evaluation.target.open_target`) on the keys of `prompts`; the
    summary, also written to `<out_dir>/mine.json`."""
    from cosmos_rl.commands.mining.scoring import ranks_by
    from cosmos_rl.commands.mining.select import best_vs_worst
    from cosmos_rl.commands.mining.shards import SUMMARY_FILE, PairShardWriter
    from cosmos_rl.commands.world_eval import world_condition

    if t.media.frames < 2:
        raise UserError(f"--reward {reward}: judges clips of chunk + 1 frames, and {t.label} makes images; pass --frames 9 (or 4k + 1)")
    if t.kind == "model":
        t.media = dataclasses.replace(t.media, fps=suite.media.fps)  # the world's own rate (its action caption names it)
    given = world_condition(MODE, t, suite)
    keys = read_keys(prompts, suite, t.media)
    windows = [suite.window(key, t.media) for key in keys]
    try:
        writer = PairShardWriter(out_dir, per_shard, t.media.fps)  # refuses an old set before any sampling
    except OSError as exc:
        raise UserError(f"--out {str(out_dir)!r}: cannot create the folder ({exc.strerror}); pass a writable folder") from None

    import torch

    from cosmos_rl.core.media import latent_shape
    from cosmos_rl.dist.world import pick_device
    from cosmos_rl.evaluation.world import WorldEvaluator, WorldItem
    from cosmos_rl.models.actions import ActionLayout

    where = pick_device(device)
    model = t.load(where, heads=True)
    transformer_config = model.parts.transformer.config
    try:
        ActionLayout.of(given.action, 1).check(transformer_config)
    except ValueError as exc:
        raise UserError(f"{t.label}: {exc}; mine a Cosmos3 model built with action heads (action_gen = true)") from None

    class MineWorld(WorldEvaluator):
        NOISE = "mine-world"

        def _labels(self, item: WorldItem) -> tuple:  # the key, not the episode's index: two keys may share it
            return (seed, item.seed, keys[item.window])

    evaluator = MineWorld(
        windows, samples, suite, given, t.settings, tokenizer=model.parts.tokenizer, vae=model.parts.vae, media=t.media,
        latent_shape=latent_shape(t.media, model.parts.vae.config, transformer_config), device=where,
        model_parts=model.model_parts, batch_size=batch_size, origin=f"--prompts {prompts}",
    )  # fmt: skip
    key = ranks_by(reward)
    n, ties, kept = len(keys), 0, []
    progress(0, n)
    with model.policy() as network, torch.no_grad():
        for first in range(0, n, ROWS_PER_CHUNK):
            rows = range(first, min(first + ROWS_PER_CHUNK, n))
            items = [evaluator.items[row * samples + k] for row in rows for k in range(samples)]
            clips, _ = evaluator.sample(network, items)
            verdicts = evaluator.judge(items, clips, None)
            for offset, row in enumerate(rows):
                span = slice(offset * samples, (offset + 1) * samples)
                strict = [float(v.strict) for v in verdicts[span]]
                partial = [float(v.partial) for v in verdicts[span]]
                ranked, other = (partial, strict) if key == "partial" else (strict, partial)
                pick = best_vs_worst(ranked)
                if pick is None:
                    ties += 1
                    continue
                w, l = pick
                meta = {
                    "id": f"mine-s{seed}-r{row:06d}", "prompt": keys[row], "task": windows[row].task, "reward": reward,
                    "winner_score": ranked[w], "loser_score": ranked[l], "scores": ranked, "winner_sample": w, "loser_sample": l,
                    ("strict" if key == "partial" else "partials"): other, "condition": MODE,
                }  # fmt: skip
                writer.add(meta, clips[span][w], clips[span][l])
                kept.append(ranked[w] - ranked[l])
            progress(rows.stop, n)
    paths = writer.close()
    if not kept:
        finer = f"use {next(r.name for r in suite.rewards if r.part == 'partial')}, or " if key != "partial" else ""
        raise UserError(f"every one of the {n} keys tied ({samples} clips scored alike under {reward}): no pair written; "
                        f"{finer}raise --samples")  # fmt: skip
    summary = {
        "target": t.label, "kind": t.kind, "step": t.step, "reward": reward, "ranked_by": key,
        "prompts": str(prompts), "rows": n, "samples": samples, "seed": seed,
        "pairs": len(kept), "ties_dropped": ties, "rows_skipped": 0, "mean_margin": sum(kept) / len(kept),
        "sampler": t.settings.resolved(model.model_parts).as_json(), "image_size": t.media.size_json(),
        "shards": [str(p) for p in paths], "frames": t.media.frames, "fps": t.media.fps, "frame_reduce": None, "rewards": None,
        # A world model's pairs: the suite whose keys the prompts are, the mode, what each clip was given.
        "suite": suite.name, "mode": MODE, "condition": given.describe(), "given_frames": evaluator.given,
        "action": dataclasses.asdict(given.action),
    }  # fmt: skip
    Path(out_dir, SUMMARY_FILE).write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return summary
