"""Preflight rules of image-to-video NFT (`rl.first_frame`, docs/video.md "I2V NFT"); torch-free.

Part of `config/preflight.py`'s NFT rules, which call `first_frame_rules`. What the rules can tell
from the manifest alone: that the run makes clips, that its prompt source can give every row a
first frame, and that a first-frame reward judges the frame the rollouts are conditioned on. The
frames themselves (present, decodable, the clip's size) are `validate --data`'s and the run's.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.core import schema
from cosmos_rl.config.preflight_rewards import owner
from cosmos_rl.config.run_suite import FIRST_FRAME_SUITES
from cosmos_rl.config.preflight_rules import Rules


def _reward_names(rl: schema.NFTConfig) -> list[tuple[str, str]]:
    """(key, name) of each reward the run scores with, as rewards.multi.reward_terms lists them."""
    if rl.rewards:
        return [(f"rl.rewards[{i}].name", t.name) for i, t in enumerate(rl.rewards)]
    return [("rl.reward.name", rl.reward.name)]


def first_frame_rules(c: schema.RunConfig, rl: schema.NFTConfig, r: Rules) -> None:
    source = rl.first_frame
    for key, name in _reward_names(rl):
        suite = owner(name)
        if suite is None or not suite.reward(name).given_frame or FIRST_FRAME_SUITES.get(source) == suite.name:
            continue
        # The suite's reward that judges the same score without the given frame, for the fix.
        part = suite.reward(name).part
        plain = next((x.name for x in suite.rewards if x.part == part and not x.given_frame), None)
        sources = [k for k, v in FIRST_FRAME_SUITES.items() if v == suite.name]
        fixes = [f'set rl.first_frame = "{sources[0]}"'] * bool(sources) + [f"use {plain!r}"] * bool(plain)
        r.error(key, f"judges frame 0 against the {suite.title} world's first frame of the caption, and this run's rollouts "
                f"are not conditioned on it (rl.first_frame = {source!r})", name, ", or ".join(fixes) or "use a reward without a given frame")  # fmt: skip
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
