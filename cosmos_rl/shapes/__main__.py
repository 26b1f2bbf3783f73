"""``python -m cosmos_rl.shapes prompts|shards|video-prompts|video-shards OUT_DIR ...``: write the
image world's or the moving-shapes world's prompt files or SFT shards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from cosmos_rl.core.errors import UserError
from cosmos_rl.shapes.clips import DEFAULT_FRAMES
from cosmos_rl.shapes.motion_world import balanced_motion, split_motion_prompts, write_motion_prompt_file
from cosmos_rl.shapes.motion_shards import write_motion_shards
from cosmos_rl.shapes.prompt_files import write_prompt_file
from cosmos_rl.shapes.shards import write_shards
from cosmos_rl.shapes.world import HELD_OUT_FRACTION, balanced, split_prompts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cosmos_rl.shapes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    prompts = commands.add_parser("prompts", help="write train.txt and held_out.jsonl")
    shards = commands.add_parser("shards", help="write webdataset shards of rendered training prompts")
    for sub in (prompts, shards):
        sub.add_argument("out_dir", type=Path)
        sub.add_argument("--seed", type=int, default=0, help="split seed (and shard seed); default 0")
        sub.add_argument("--fraction", type=float, default=HELD_OUT_FRACTION,
                         help=f"held-out share of each task; default {HELD_OUT_FRACTION}")
    prompts.add_argument("--balanced", type=int, default=0, metavar="N",
                         help="write N task-balanced training rows instead of every training prompt once")
    shards.add_argument("--samples", type=int, required=True, help="number of samples (task-balanced)")
    shards.add_argument("--size", type=int, default=32, help="image side in pixels; default 32")
    shards.add_argument("--per-shard", type=int, default=1000, help="samples per shard; default 1000")
    video_prompts = commands.add_parser("video-prompts", help="write the moving-shapes world's train.txt and held_out.jsonl")
    video_shards = commands.add_parser("video-shards", help="write webdataset shards of rendered training clips (mp4)")
    for sub in (video_prompts, video_shards):
        sub.add_argument("out_dir", type=Path)
        sub.add_argument("--seed", type=int, default=0, help="split seed (and clip seed); default 0")
    video_prompts.add_argument("--balanced", type=int, default=0, metavar="N",
                               help="write N task-balanced training rows instead of every training prompt once")
    video_shards.add_argument("--samples", type=int, required=True, help="number of clips (task-balanced)")
    video_shards.add_argument("--size", type=int, default=32, help="frame side in pixels; default 32")
    video_shards.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help=f"frames per clip (4k + 1); default {DEFAULT_FRAMES}")
    video_shards.add_argument("--fps", type=float, default=24.0, help="the mp4 files' frame rate; default 24")
    video_shards.add_argument("--per-shard", type=int, default=1000, help="clips per shard; default 1000")
    return parser


def _write_prompts(args, split, draw, write) -> None:
    """train.txt (every training prompt once, or ``--balanced`` N rows drawn by ``draw``) and
    held_out.jsonl of either world's ``split``, written by ``write``."""
    if args.balanced < 0:
        raise UserError(f"--balanced must be >= 0, got {args.balanced}")
    train = draw(split.train, args.balanced, args.seed) if args.balanced else split.train_captions()
    held_out = split.held_out_captions()
    write(args.out_dir / "train.txt", train)
    write(args.out_dir / "held_out.jsonl", held_out)
    print(f"wrote {len(train)} training rows to {args.out_dir / 'train.txt'} and "
          f"{len(held_out)} held-out prompts to {args.out_dir / 'held_out.jsonl'}")
    for task in split.tasks:
        print(f"  {task}: {len(split.train[task])} train, {len(split.held_out[task])} held out")


def _check_samples(args) -> None:
    if args.samples <= 0:
        raise UserError(f"--samples must be positive, got {args.samples}")


def _image(args) -> None:
    if not 0.0 < args.fraction < 1.0:
        raise UserError(f"--fraction must be between 0 and 1, got {args.fraction}")
    split = split_prompts(args.seed, args.fraction)
    if args.command == "prompts":
        _write_prompts(args, split, balanced, write_prompt_file)
        return
    _check_samples(args)
    specs = balanced(split.train, args.samples, args.seed)
    paths = write_shards(args.out_dir, specs, args.seed, args.size, args.per_shard)
    print(f"wrote {len(specs)} samples in {len(paths)} shards to {args.out_dir}")


def _video(args) -> None:
    split = split_motion_prompts(args.seed)
    if args.command == "video-prompts":
        _write_prompts(args, split, balanced_motion, write_motion_prompt_file)
        return
    _check_samples(args)
    if args.frames < 5 or (args.frames - 1) % 4:  # the Wan VAE reads frame 0, then chunks of 4 (shapes sits below models/)
        raise UserError(f"--frames must be 4k + 1 and at least 5 (the Wan VAE's clips), got {args.frames}")
    specs = balanced_motion(split.train, args.samples, args.seed)
    paths = write_motion_shards(args.out_dir, specs, args.seed, args.size, args.frames, args.fps, args.per_shard)
    print(f"wrote {len(specs)} clips of {args.frames} frames in {len(paths)} shards to {args.out_dir}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        (_video if args.command.startswith("video-") else _image)(args)
    except (UserError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
