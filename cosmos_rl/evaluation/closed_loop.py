"""Closed-loop evaluation of a Push-T policy: the model acts in the simulator (`pusht.closed_loop`),
each action chunk generated in `policy` mode by the very sampling code the held-out windows use
(`evaluation.world.WorldSampler`): frame 0 given (the environment's current frame), frames and
action rows generated, the rows read back in world units and the first `execute` of them stepped.

- **Items**: held-out initial states x seeds, state-major (`WorldItem`: `window` is the state's
  number). Each chunk's latent and action-row noise comes from ("closed-loop", seed, state, chunk
  index), so an episode's noise is fixed by (initial state, seed) whatever else shares its batch
  (episodes that end drop out of it), and a checkpoint and its base meet identical noise at every
  chunk index (paired; their episodes part once their actions differ, which is the point).
- **Scores** (`scores`): per item, success (0 or 1) in the strict slot and the max coverage in the
  partial slot, each a state's mean over its seeds, bootstrapped over states (`evaluation.intervals`,
  one task `TASK`); the metrics beside them: the final coverage and the mean per-chunk coverage
  change (`pusht.closed_loop.chunk_rewards`).
- **Sheets** (`write_episode_gif`): one row per shown episode and model: the environment's frames
  and, beside them, the frame the model predicted for each step, both with the goal T outlined
  (`pusht.sim.goal_outline`), upscaled to readable tiles; an episode that ended early holds its
  last frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from cosmos_rl.core.errors import UserError
from cosmos_rl.evaluation.world import WorldItem, WorldSampler, WorldScores, _scores
from cosmos_rl.pusht.closed_loop import LoopEpisode, run_closed_loop

STREAM = "closed-loop"  # the noise stream of closed-loop chunks (the held-out windows draw "eval-world")
TASK = "env_start"  # the one task: the env's own start distribution
OUTLINE_RGB = (220, 40, 40)  # the goal T's outline on every tile


class ClosedLoopEvaluator:
    """The initial states x seeds of one closed-loop evaluation, sampled by `sampler` (policy mode)."""

    def __init__(self, sampler: WorldSampler, starts: np.ndarray, seeds: int, caption: str, *, execute: int, max_steps: int):
        spec = sampler.spec
        if spec is None or spec.mode != "policy":
            raise ValueError("a closed-loop evaluation samples in policy mode (frame 0 given, frames and actions generated)")
        if len(starts) < 1 or seeds < 1:
            raise ValueError(f"need at least one initial state and one seed, got {len(starts)} and {seeds}")
        self.sampler, self.starts, self.seeds, self.caption = sampler, np.asarray(starts, dtype=np.float64), int(seeds), caption
        self.chunk, self.execute, self.max_steps = spec.chunk, int(execute), int(max_steps)
        self.items = [WorldItem(w * self.seeds + s, w, s) for w in range(len(self.starts)) for s in range(self.seeds)]
        self.on_chunk: Callable[[int, int], None] | None = None  # (chunk index, episodes still running)

    def run(self, transformer: torch.nn.Module) -> list[LoopEpisode]:
        """Every item's episode, in item order."""

        def policy(frames: np.ndarray, index: int, members: Sequence[int]):
            if self.on_chunk is not None:
                self.on_chunk(index, len(members))
            labels = [(self.items[m].seed, self.items[m].window, index) for m in members]
            clips, actions = self.sampler.sample(transformer, frames[:, None], [self.caption] * len(members), labels, STREAM)
            return actions, clips

        starts = [self.starts[item.window] for item in self.items]
        media = self.sampler.media
        return run_closed_loop(starts, policy, chunk=self.chunk, execute=self.execute, max_steps=self.max_steps,
                               size=(media.height, media.width))  # fmt: skip

    def scores(self, episodes: Sequence[LoopEpisode]) -> WorldScores:
        """Success (strict) and max coverage (partial) over states with intervals; final coverage and
        the mean chunk coverage change as metrics."""
        if len(episodes) != len(self.items):
            raise ValueError(f"{len(episodes)} episodes for {len(self.items)} items")
        tasks_of = [TASK] * len(self.starts)
        outcomes = [episode.outcome for episode in episodes]
        main = _scores("pusht closed-loop success", tasks_of, self.items, [float(o.success) for o in outcomes],
                       [o.max_coverage for o in outcomes])  # fmt: skip
        metrics = {
            "final_coverage": _scores("final_coverage", tasks_of, self.items, [o.final_coverage for o in outcomes], None),
            "chunk_coverage_change": _scores("chunk_coverage_change", tasks_of, self.items,
                                             [float(np.mean(episode.rewards)) for episode in episodes], None),  # fmt: skip
        }
        return WorldScores(main, metrics)


def episode_json(item: WorldItem, episode: LoopEpisode) -> dict:
    """One episode as eval.json lists it: what it was given, what the model generated and did, what happened."""
    outcome = episode.outcome
    return {
        "start": item.window, "seed": item.seed, "success": outcome.success, "steps": outcome.steps,
        "final_coverage": outcome.final_coverage, "max_coverage": outcome.max_coverage,
        "chunk_rewards": [float(r) for r in episode.rewards],
        "chunks": [{"step": c.step, "executed": c.executed, "actions": c.actions.tolist()} for c in episode.chunks],
        "coverages": episode.coverages.tolist(), "final_state": episode.states[-1].tolist(),
    }  # fmt: skip


# ---------------------------------------------------------------------------------- sheets
def _outlined(frames: np.ndarray, outline: np.ndarray) -> np.ndarray:
    """uint8 [T, H * s, W * s, 3]: `frames` upscaled by the sheets' whole factor (nearest: no pixel
    the model did not draw is smoothed) with the goal outline (pixel points at the frames' size)
    drawn over each."""
    from PIL import Image, ImageDraw

    from cosmos_rl.evaluation.grid import scale_of

    scale = scale_of(*frames.shape[1:3])
    points = [((x + 0.5) * scale - 0.5, (y + 0.5) * scale - 0.5) for x, y in outline]
    out = []
    for frame in frames:
        image = Image.fromarray(np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1), "RGB")
        ImageDraw.Draw(image).line(points, fill=OUTLINE_RGB, width=max(1, scale // 2))
        out.append(np.asarray(image))
    return np.stack(out)


def _held(frames: np.ndarray, length: int) -> np.ndarray:
    """`frames` padded to `length` by holding the last one (an episode that ended early)."""
    return np.concatenate([frames, np.repeat(frames[-1:], length - len(frames), axis=0)]) if len(frames) < length else frames


def write_episode_gif(path: Path, labels: Sequence[str], models: Sequence[tuple[str, Sequence[LoopEpisode]]]) -> Path:
    """The animated sheet at `path` (.gif): per shown episode (`labels`) and model (`models`: its
    label and its episodes, in `labels`' order) a row of (the environment's frames | the model's
    predicted frames), the goal outlined on both."""
    from cosmos_rl.evaluation.grid import Tile, save_clip_gif
    from cosmos_rl.pusht.sim import goal_outline

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path.parent}: cannot create the evaluation folder ({exc.strerror}); pass a writable --out") from None
    length = max(len(episode.frames) for _, episodes in models for episode in episodes)
    outline = None
    rows = []
    for k, label in enumerate(labels):
        for name, episodes in models:
            episode = episodes[k]
            outline = goal_outline(episode.frames.shape[1:3]) if outline is None else outline
            outcome = episode.outcome
            verdict = (f"success at step {outcome.steps}" if outcome.success else f"max coverage {outcome.max_coverage:.2f}")
            rows.append((f"{name}\n{label}", [
                Tile(_outlined(_held(episode.frames, length), outline), f"{name}: environment, {outcome.steps} steps", verdict, outcome.success),
                Tile(_outlined(_held(episode.predicted_timeline(), length), outline),
                     f"{name}: predicted ({len(episode.chunks)} chunks)", f"final coverage {outcome.final_coverage:.2f}", None),
            ]))  # fmt: skip
    return save_clip_gif(path.with_suffix(".gif"), rows)
