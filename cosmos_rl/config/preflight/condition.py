"""Preflight rules of what a sample is conditioned on: image-to-video's first frame, today two
settings, NFT's `rl.first_frame` (docs/video.md "I2V NFT") and SFT's `rl.first_frame_condition`.
`nft.py` and `sft.py` call these; torch-free.

What the rules can tell from the manifest alone: that the run makes clips, that its prompt source
can give every row a first frame, and that a first-frame reward judges the frame the rollouts are
conditioned on. The frames themselves (present, decodable, the clip's size) are `validate --data`'s
and the run's.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.config.preflight.rewards import I2V_REWARDS
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema


def _reward_names(rl: schema.NFTConfig) -> list[tuple[str, str]]:
    """(key, name) of each reward the run scores with, as rewards.multi.reward_terms lists them."""
    if rl.rewards:
        return [(f"rl.rewards[{i}].name", t.name) for i, t in enumerate(rl.rewards)]
    return [("rl.reward.name", rl.reward.name)]


def first_frame_rules(c: schema.RunConfig, rl: schema.NFTConfig, r: Rules) -> None:
    """NFT's `rl.first_frame`: where each rollout's first frame comes from."""
    source = rl.first_frame
    for key, name in _reward_names(rl):
        if name in I2V_REWARDS and source != "shapes_world":
            r.error(key, "judges frame 0 against the moving-shapes world's first frame of the caption, and this run's rollouts "
                    f"are not conditioned on it (rl.first_frame = {source!r})", name,
                    f'set rl.first_frame = "shapes_world", or use {name.replace("_i2v", "")!r}')  # fmt: skip
    if source == "none":
        return
    if rl.modality != "video" or c.model.num_frames == 1:
        r.error("rl.first_frame", "conditions a clip's first frame, and this run makes images", source,
                'remove rl.first_frame, or make video: rl.modality = "video" with model.num_frames = 4k + 1 above 1')
        return
    suffix = Path(rl.prompts.file).suffix.lower()
    if source == "image" and suffix != ".jsonl":
        r.error("rl.first_frame", 'takes each prompt row\'s "image", so it needs a JSONL rl.prompts.file', rl.prompts.file or "(built-in prompts)",
                'set rl.prompts.file to a .jsonl file of {"prompt": ..., "image": "frames/0.png"} rows (paths relative to it)')
    elif source == "shapes_world" and not rl.prompts.file:
        r.error("rl.first_frame", "renders the moving-shapes world's first frame of each caption, and the built-in prompts "
                "are image captions, not video captions", "(built-in prompts)",
                "set rl.prompts.file, e.g. shapes_video_train.txt (python -m cosmos_rl.shapes video-prompts DIR)")  # fmt: skip


def first_frame_condition_rule(c: schema.RunConfig, rl: schema.SFTConfig, r: Rules) -> None:
    """SFT's `rl.first_frame_condition`: the share of clips trained image-to-video."""
    if not 0 <= rl.first_frame_condition <= 1:
        r.error("rl.first_frame_condition", "must be in [0, 1]", rl.first_frame_condition, "use e.g. 0.5 (half the clips train image-to-video)")
    elif rl.first_frame_condition > 0 and (c.model.num_frames == 1 or rl.train == "vae"):
        r.error("rl.first_frame_condition", "conditions a clip's first frame, and this run trains no clips through the transformer",
                rl.first_frame_condition, 'remove it, or train video (model.num_frames > 1) with rl.train = "transformer"')
