"""One process plays every rank of an online group (NFT's, GRPO's; no Ray, no process group, no
HTTP): test code.

It exists so fast tests drive the real online step through public calls, and so a test can show that
one process playing G ranks gives the numbers G Ray actors give. No manifest reaches it: a run
always makes one sample per model rank (the spec's rule), so it lives with the tests, not the package.
Rewards are the built-in reward functions called in-process (the service would compute the
same function of the same lossless pixels): image rewards on images, the clip rewards
(`shapes_video_*`) on a video run's clips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.trainers.loop import LoopSpec, run_steps
from cosmos_rl.trainers.online import OnlineTrainer


class LocalCollectives:
    """This process plays every rank 0..world_size-1 of the group (no process group)."""

    cp = None  # no context parallelism: every forward is whole
    scores = leader = True

    def __init__(self, world_size: int, device: torch.device):
        self.ranks = tuple(range(world_size))
        self.world_size = world_size
        self.device = device

    def gather(self, own: list[torch.Tensor]) -> torch.Tensor:
        assert len(own) == self.world_size, "one value per played rank"
        return torch.stack([t.contiguous() for t in own])

    def mean(self, own: list[dict[str, float]]) -> dict[str, float]:
        assert len(own) == self.world_size, "one metrics dict per played rank"
        keys = sorted(own[0])
        vec = torch.tensor([[float(values[k]) for k in keys] for values in own], dtype=torch.float64).sum(0)
        vec /= self.world_size
        return dict(zip(keys, vec.tolist()))


def local_trainer(config: schema.RunConfig, run_dir: Path, device: torch.device | None = None) -> OnlineTrainer:
    """The run's unbuilt online rank trainer (NFTTrainer, GRPOTrainer) playing all `rl.group_size`
    ranks, scoring with the built-in reward in-process."""
    from cosmos_rl.rewards.multi import reward_terms
    from cosmos_rl.rewards.registry import builtin_rewards

    assert isinstance(config.rl, schema.OnlineRLBase), "an online algorithm's config"
    trainer_cls = algorithms.of(config).resolve("trainer")
    # built-in rewards only; on a video run a clip reward takes whole clips and an image reward
    # scores each clip frame by frame as the client does (rewards/frames.py: stride, reducer)
    builtin = builtin_rewards()
    terms = reward_terms(config.rl)
    rewards = {t.name: builtin[t.name].fn if "video" in builtin[t.name].modalities else _per_frame(builtin[t.name].fn, t) for t in terms}
    takes_actions = {t.name for t in terms if builtin[t.name].takes_actions}  # a policy-mode reward: handed the executed rows

    def score(rank: int, pixels: np.ndarray, prompts: Sequence[str], actions: np.ndarray | None = None) -> dict[str, list[float]]:
        return {name: [float(v) for v in (fn(pixels, list(prompts), actions=actions) if name in takes_actions else fn(pixels, list(prompts)))]
                for name, fn in rewards.items()}

    device = device or torch.device("cpu")
    return trainer_cls(config, Path(run_dir), device, LocalCollectives(config.rl.group_size, device), score)


def _per_frame(image_reward, term):
    """An image reward that also takes clips [N, F, H, W, 3], frame by frame (against the clip's own prompt)."""
    from cosmos_rl.rewards import frames

    def fn(pixels: np.ndarray, prompts: list[str]) -> list[float]:
        if pixels.ndim == 4:
            return image_reward(pixels, prompts)
        picked = frames.scored_frames(pixels.shape[1], term.frame_reduce, term.frame_stride)
        return [frames.reduce_scores([float(v) for v in image_reward(clip[picked], [p] * len(picked))], term.frame_reduce)
                for clip, p in zip(pixels, prompts)]

    return fn


def run_local(config: schema.RunConfig, run_dir: Path, *, resume: bool = False) -> list[dict]:
    """Train to `rl.max_steps` in this process with the shared step loop; returns the metrics rows written."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if resume:
        from cosmos_rl.trainers.online_state import check_seed_contract

        check_seed_contract(config, Path(run_dir))
    trainer = local_trainer(config, run_dir)
    start = trainer.build(resume)
    spec = LoopSpec(
        run_dir=Path(run_dir), start_step=start, resumed=resume, main=True, unit="samples",
        items_per_step=config.rl.group_size * config.rl.prompts_per_step,
        progress_fields=tuple(trainer.progress_fields),
    )
    from cosmos_rl.evaluation.during import with_eval

    step_fn, holdout_fn, halt = with_eval(config, trainer.train_step, None, trainer.evaluate, main=True)
    try:
        return run_steps(config, spec, step_fn, trainer.save, lambda: None, holdout_fn, halt=halt)
    finally:
        trainer.close()  # rl.async_reward: no scoring thread outlives the run
