"""Evaluating a world model in an episode suite (`suites.base`, "An episode suite"): every held-out
window x seed generated in one mode, judged by the suite's verifier, scored with bootstrap
intervals over windows, and shown as labelled side-by-side clips (truth | prediction | difference).

A sample of a window is what `models.generate.generate` takes for that mode, as the parity test
(tests/test_world_model_parity.py) drives it:
- the given frames: the window's true leading frames as clean latents (`clip_condition_latents`:
  frame 0 for forward dynamics, policy and image-to-video continuation, every latent frame for
  inverse dynamics, the leading latent frames of a k-frame condition for video-to-video);
- the action rows (action modes): the window's true actions as the model's rows (`model_rows`,
  normalised by the condition's `ActionSpec`) held clean for forward dynamics, noise for the modes
  that generate them (`start_rows`); generated rows are read back in the embodiment's units
  (`raw_actions`) for the verifier;
- the caption: the pipeline's structured action caption of the episode's task (action modes), or
  the task under the model's prompt template (continuation).

Noise is drawn per (seed, episode, window start) on the CPU (`models.generate.noise`), so a
checkpoint and its base, or two runs, are compared on identical noise: the change is paired.

Scores: a window's score is the mean over its seeds (the unit the bootstrap resamples, as a
prompt is in `evaluation.intervals`); a task's (episode maker's) score the mean over its windows;
the overall score the mean of the task scores. Strict and partial come from the suite's verdicts,
and each further number a verdict carries (an action error, a coverage change) is averaged and
bootstrapped the same way. `judge` is the seam between sampling and scoring: it takes any frames
and actions (ground truth scores strict 1.0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import torch

from cosmos_rl.core.condition import Condition
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec, vae_temporal_factor
from cosmos_rl.evaluation.scores import EvalScores, PromptTotals, with_intervals
from cosmos_rl.models.sampler_settings import SamplerSettings
from cosmos_rl.suites.base import Suite, WindowVerdict

CONTINUATION = "continuation"  # the mode of a condition without actions (leading frames given)
DATASET_TASK = "dataset"  # the one task of windows read from a user's LeRobot dataset


@dataclass(frozen=True)
class WorldItem:
    index: int  # in the evaluation's order: window-major, seeds inner
    window: int  # the window's number
    seed: int


def mode_of(condition: Condition) -> str:
    """The suite verifier's mode for `condition`: its action mode, or continuation."""
    if not condition.is_conditioned:
        raise ValueError("an episode suite's windows are generated under a condition (frames given)")
    return condition.kind.action_mode or CONTINUATION


def dataset_windows(root: Path, per_task: int, media: MediaSpec) -> list:
    """Windows of `media.frames` frames from the LeRobot dataset at `root`: one per episode (its
    middle window), `per_task` episodes evenly spread over the dataset (0 = all), all under the task
    `dataset`. An episode shorter than a window is passed over; frames must be `media`'s size."""
    from cosmos_rl.data.episodes import EpisodeWindow
    from cosmos_rl.data.lerobot import open_dataset
    from cosmos_rl.suites.base import spread

    folder = open_dataset(root)
    meta = folder.meta
    if tuple(meta.image_size) != tuple(media.size):
        raise UserError(f"--data {root}: its frames ({meta.image_key}) are {meta.image_size[0]}x{meta.image_size[1]}, the model "
                        f"samples {media.height}x{media.width}; evaluate at the dataset's size (--image-size for a model folder) "
                        "or write the episodes at the model's")  # fmt: skip
    chunk = media.frames - 1
    fitting = [index for index, length in zip(meta.episodes, meta.lengths) if length > chunk]
    if not fitting:
        raise UserError(f"--data {root}: no episode has {media.frames} frames (a window), the longest has {max(meta.lengths, default=0)}; "
                        "evaluate shorter clips (--frames) or add longer episodes")  # fmt: skip
    windows = []
    for index in spread(fitting, per_task):
        episode = folder.episode(index)
        start = spread(list(episode.windows(chunk)), 1)[0]
        windows.append(EpisodeWindow(episode=episode, start=start, chunk=chunk, task=DATASET_TASK))
    return windows


class WorldSampler:
    """Samples of one condition from given frames: the frozen parts (tokenizer, VAE) and the sampler
    settings, shared by the held-out windows (`WorldEvaluator`) and closed-loop rollouts
    (`evaluation.closed_loop`), so both generate with the same code."""

    def __init__(
        self, condition: Condition, settings: SamplerSettings, *, tokenizer, vae, media: MediaSpec, latent_shape: tuple[int, ...],
        device: torch.device, model_parts, batch_size: int = 8,
    ):  # fmt: skip
        self.condition, self.settings, self.tokenizer, self.vae, self.media = condition, settings, tokenizer, vae, media
        self.latent_shape, self.device, self.model_parts, self.batch_size = tuple(latent_shape), device, model_parts, batch_size
        self.spec = condition.action  # None for continuation
        if self.spec is not None and self.spec.frames != media.frames:
            raise ValueError(f"an action chunk of {self.spec.chunk} spans {self.spec.frames} frames, the media has {media.frames}")
        self.clean_latents = condition.clean_latent_frames(media, vae_temporal_factor(vae.config))
        self._ids: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _prompt(self, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        if caption not in self._ids:
            template = getattr(self.model_parts, "prompt_template", "chat")
            if self.spec is not None:
                from cosmos_rl.models.actions import action_prompt_ids

                cond, uncond = action_prompt_ids(self.tokenizer, template, [caption], self.spec, self.media)
            else:
                from cosmos_rl.models.text import model_prompt_ids

                cond, uncond = model_prompt_ids(self.tokenizer, template, [caption], self.media)
            self._ids[caption] = (cond[0].to(self.device), uncond[0].to(self.device))
        return self._ids[caption]

    @torch.no_grad()
    def sample(
        self, transformer: torch.nn.Module, given: np.ndarray, captions: Sequence[str], labels: Sequence[tuple], stream: str,
        actions: np.ndarray | None = None, on_batch: Callable[[int, int], None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """(uint8 clips [N, F, H, W, 3], actions [N, chunk, width] in the embodiment's units, or None
        without actions) of N samples, `batch_size` per sampler call: sample i is given the leading
        frames of `given[i]` (uint8 [N, F', H, W, 3], at least the condition's clean frames), its
        true action rows `actions[i]` where the mode holds them clean (forward dynamics), and the
        caption `captions[i]`; its latent and action-row noise are drawn from (`stream`, *labels[i])."""
        from cosmos_rl.dist.fsdp import gathered_while_sampling
        from cosmos_rl.models.actions import ActionLayout, model_rows, raw_actions, start_rows
        from cosmos_rl.models.generate import clip_condition_latents, generate, noise
        from cosmos_rl.models.text_kv import held_while_sampling

        mp = self.model_parts
        parts = SimpleNamespace(transformer=transformer, vae=self.vae, scheduler=mp.scheduler, native_flow_schedule=mp.native_flow_schedule)
        clips, generated = [], []
        with gathered_while_sampling(transformer), held_while_sampling(transformer):
            for start in range(0, len(labels), self.batch_size):
                batch = range(start, min(start + self.batch_size, len(labels)))
                ids = [self._prompt(captions[i]) for i in batch]
                latents = torch.cat([noise((1, *self.latent_shape), stream, *labels[i], device=self.device) for i in batch])
                truth = torch.from_numpy(np.stack([given[i] for i in batch])).to(self.device)
                condition = clip_condition_latents(self.vae, truth, self.clean_latents)
                extra = {}
                if self.spec is not None:
                    action_dim = int(transformer.config.action_dim)
                    layout = ActionLayout.of(self.spec, len(batch))
                    clean = None
                    if self.spec.mode == "forward_dynamics":
                        raw = torch.from_numpy(np.stack([actions[i] for i in batch]).astype(np.float32)).to(self.device)
                        clean = model_rows(self.spec, raw, action_dim)
                    row_noise = torch.cat([noise((1, self.spec.chunk, action_dim), f"{stream}-actions", *labels[i], device=self.device)
                                           for i in batch])  # fmt: skip
                    extra = {"actions": start_rows(row_noise, clean, layout), "action_layout": layout}
                out = generate(parts, self.media, ([c for c, _ in ids], [u for _, u in ids]), latents, self.settings,
                               condition=condition, **extra)  # fmt: skip
                clips.append(out[1].numpy())
                if self.spec is not None:
                    generated.append(raw_actions(self.spec, out[2]).float().cpu().numpy())
                if on_batch is not None:
                    on_batch(batch.stop, len(labels))
        return np.concatenate(clips), (np.concatenate(generated) if generated else None)


class WorldEvaluator:
    """The windows x seeds of one evaluation and the frozen parts (tokenizer, VAE) that sample them.
    `NOISE` and `_labels` name each item's noise stream (`pairs mine` draws its own through them)."""

    NOISE = "eval-world"

    def __init__(
        self, windows: Sequence, seeds: int, suite: Suite, condition: Condition, settings: SamplerSettings, *,
        tokenizer, vae, media: MediaSpec, latent_shape: tuple[int, ...], device: torch.device, model_parts,
        batch_size: int = 8, origin: str = "the held-out windows",
    ):  # fmt: skip
        if not windows:
            raise ValueError("a world evaluation needs at least one window")
        self.windows, self.seeds, self.suite, self.condition = list(windows), int(seeds), suite, condition
        self.mode = mode_of(condition)
        self.sampler = WorldSampler(condition, settings, tokenizer=tokenizer, vae=vae, media=media, latent_shape=latent_shape,
                                    device=device, model_parts=model_parts, batch_size=batch_size)  # fmt: skip
        self.media, self.origin, self.spec = media, origin, self.sampler.spec
        self.items = [WorldItem(w * self.seeds + s, w, s) for w in range(len(self.windows)) for s in range(self.seeds)]
        # The pixel frames a sample is given (the verifier judges the rest); inverse dynamics: all.
        self.given = condition.kind.pixel_frames(media)
        self.on_batch: Callable[[int, int], None] | None = None

    # ------------------------------------------------------------------------------ sampling
    def _labels(self, item: WorldItem) -> tuple:
        window = self.windows[item.window]
        return (item.seed, window.episode.index, window.start)

    def sample(self, transformer: torch.nn.Module, items: Sequence[WorldItem]) -> tuple[np.ndarray, np.ndarray | None]:
        """(uint8 clips [N, F, H, W, 3], actions [N, chunk, width] in the embodiment's units, or None
        without actions) of `items` (`WorldSampler.sample`, noise from (`NOISE`, seed, episode, window
        start))."""
        windows = [self.windows[item.window] for item in items]
        actions = np.stack([window.actions for window in windows]) if self.spec is not None else None
        return self.sampler.sample(transformer, np.stack([window.frames for window in windows]), [window.caption for window in windows],
                                   [self._labels(item) for item in items], self.NOISE, actions=actions, on_batch=self.on_batch)  # fmt: skip

    # ------------------------------------------------------------------------------- scoring
    def judge(self, items: Sequence[WorldItem], clips: np.ndarray, actions: np.ndarray | None) -> list[WindowVerdict]:
        """The suite's verdict on each item's clip and actions (given or generated): the scoring
        seam. Without generated actions the window's own are the ones the sample was given."""
        verdicts = []
        for k, item in enumerate(items):
            window = self.windows[item.window]
            acted = actions[k] if actions is not None and self.spec is not None and self.spec.generates_actions else window.actions
            try:
                verdicts.append(self.suite.judge(self.mode, window, clips[k], acted, self.given))
            except ValueError as exc:
                raise UserError(f"{self.origin}: {window.label}: the {self.suite.title} verifier cannot judge it ({exc}); "
                                f"evaluate episodes of the {self.suite.title} world (with its states)") from None  # fmt: skip
        return verdicts

    def scores(self, verdicts: Sequence[WindowVerdict]) -> "WorldScores":
        """Strict and partial (and each verdict metric) over windows, with bootstrap intervals."""
        if len(verdicts) != len(self.items):
            raise ValueError(f"{len(verdicts)} verdicts for {len(self.items)} items")
        tasks_of = [window.task for window in self.windows]
        label = f"{self.suite.name} {self.mode}"
        main = _scores(label, tasks_of, self.items, [v.strict for v in verdicts], [v.partial for v in verdicts])
        names = list(dict.fromkeys(name for v in verdicts for name in v.metrics))
        metrics = {name: _scores(name, tasks_of, self.items, [float(v.metrics[name]) for v in verdicts], None) for name in names}
        return WorldScores(main, metrics)


@dataclass(frozen=True)
class WorldScores:
    main: EvalScores  # strict (score) and partial, with intervals
    metrics: dict[str, EvalScores]  # each verdict metric in the strict slot, with its interval


def _scores(label: str, tasks_of: Sequence[str], items: Sequence[WorldItem], values: Sequence[float],
            partials: Sequence[float] | None) -> EvalScores:  # fmt: skip
    prompts = PromptTotals.empty(len(tasks_of))
    for k, item in enumerate(items):
        prompts.add(item.window, values[k], partials[k] if partials is not None else None)
    strict = prompts.by_task(tasks_of, "score")
    partial = prompts.by_task(tasks_of, "partial") if partials is not None else None
    tasks = {task: float(np.mean(v)) for task, v in strict.items()}
    tasks_partial = {task: float(np.mean(v)) for task, v in partial.items()} if partial is not None else None
    counts = {task: sum(1 for item in items if tasks_of[item.window] == task) for task in tasks}
    scores = EvalScores(
        reward=label, score=float(np.mean(list(tasks.values()))), tasks=tasks, images=counts,
        score_partial=float(np.mean(list(tasks_partial.values()))) if tasks_partial is not None else None, tasks_partial=tasks_partial,
    )  # fmt: skip
    return with_intervals(scores, prompts, tasks_of)


# ---------------------------------------------------------------------------------- sheets
def difference_clip(prediction: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """uint8 |prediction - truth| per pixel and channel (black where they agree)."""
    return np.abs(prediction.astype(np.int16) - truth.astype(np.int16)).astype(np.uint8)


def write_sheets(path: Path, windows: Sequence, truths: Sequence[np.ndarray], models: Sequence[tuple[str, Sequence, Sequence[WindowVerdict]]],
                 mode: str) -> tuple[Path, Path]:  # fmt: skip
    """A labelled side-by-side sheet per kept window: truth | each model's prediction | its difference
    from the truth. The GIF at `path` (.gif) plays one row per window; the PNG beside it shows every
    frame as strips. `models`: (label, its clips of the windows, its verdicts)."""
    from cosmos_rl.evaluation.grid import Tile, clip_strips, save_clip_gif, save_sheet, verdict_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path.parent}: cannot create the evaluation folder ({exc.strerror}); pass a writable --out") from None
    rows = []
    for k, (window, truth) in enumerate(zip(windows, truths)):
        tiles = [Tile(truth, f"truth: {window.label}", "ground truth", None)]
        for label, clips, verdicts in models:
            verdict = verdicts[k]
            text, passed = verdict_text(mode, verdict.strict, verdict.partial)
            extra = "".join(f", {name} {value:.3g}" for name, value in verdict.metrics.items())
            diff = difference_clip(clips[k], truth)
            tiles.append(Tile(clips[k], f"{label} ({mode}){extra}", text, passed))
            tiles.append(Tile(diff, f"|{label} - truth|", f"mean {float(diff.mean()):.1f} of 255", None))
        rows.append((f"window {k}", tiles))
    gif = save_clip_gif(path.with_suffix(".gif"), rows)
    # The strips: one row per (window, column), each column's clip left to right in time.
    columns = [(tile.caption.split(":")[0].split(" (")[0], [row[1][c] for row in rows]) for c, tile in enumerate(rows[0][1])]
    png = save_sheet(path.with_suffix(".png"), [(label, tiles) for label, tiles in clip_strips(columns)])
    return png, gif
