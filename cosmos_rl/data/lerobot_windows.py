"""Windows of a LeRobot-format dataset named by a key: the prompt rows of an online world-model run
on a dataset (`[model.condition] source = "lerobot"`, docs/world.md).

A key `lerobot window episode=I start=K root=/abs/dataset` names the window of the run's
`model.num_frames` frames from frame K of episode I (its `episode_index`) of the dataset folder
`root`; `lerobot window episode=I start=K camera=KEY root=/abs/dataset` reads the video `KEY` of a
dataset with several. The folder is in the key, so any process (every rank, the built-in reward
service, a `cosmos-rl reward serve` on the same machine) rebuilds the same window from the key alone,
as the `pusht` suite's keys are (`pusht/windows.py`): nothing else travels with a rollout but its
prompt string. `root` is last (it takes the rest of the row, spaces included) and absolute (a
relative path would mean another folder in a process started elsewhere).

`window(key, media, check_only)` is the `EpisodeWindow`: its frames must be the run's size (the data
is never resized) and the dataset's fps the run's; `check_only` reads the dataset's metadata alone
(nothing decoded) so every row of a prompt file is checked before step 1. Opened folders and decoded
episodes are kept (`KEPT_FOLDERS`, `KEPT_EPISODES`): a group's rollouts and every later draw share them.

``python -m cosmos_rl.data.lerobot_windows OUT.txt --dataset DIR --frames F [--stride K] [--camera KEY]``
writes the keys of every K-th window of every episode as a prompt file.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec

TASK = "dataset"  # the task every window counts under (as `eval --data` groups a dataset's windows)
TASKS = (TASK,)  # the lerobot suite's tasks
KEPT_FOLDERS = 8  # opened datasets kept (metadata only)
KEPT_EPISODES = 64  # decoded episodes kept; each is [T, H, W, 3] uint8
_PATTERN = r"lerobot window episode=(\d+) start=(\d+)(?: camera=(\S+))? root=(.+)"
FORM = "lerobot window episode=I start=K [camera=KEY] root=/absolute/dataset/folder"


def window_key(root: str | Path, episode: int, start: int, camera: str = "") -> str:
    """The key of a window (module docstring); `root` made absolute."""
    camera_part = f" camera={camera}" if camera else ""
    return f"lerobot window episode={int(episode)} start={int(start)}{camera_part} root={Path(root).resolve()}"


def parse_key(key: str) -> tuple[str, int, int, str]:
    """(root, episode, start, camera) of a key; ValueError naming the problem."""
    match = re.fullmatch(_PATTERN, key.strip())
    if match is None:
        raise ValueError(f"{key!r} is not a LeRobot window key ({FORM})")
    episode, start, camera, root = match.groups()
    if not Path(root).is_absolute():
        raise ValueError(f"{key!r}: root {root!r} is not an absolute path (every process must read the same folder)")
    return root, int(episode), int(start), camera or ""


@lru_cache(maxsize=KEPT_FOLDERS)
def _folder(root: str, camera: str):
    from cosmos_rl.data.lerobot import open_dataset

    return open_dataset(root, image_key=camera or None)


@lru_cache(maxsize=KEPT_EPISODES)
def _episode(root: str, camera: str, index: int):
    return _folder(root, camera).episode(index)


def window(key: str, media: MediaSpec, check_only: bool = False, check_fps: bool = True):
    """The `EpisodeWindow` of `media.frames` frames `key` names (module docstring); ValueError for a
    bad key, a folder that is no readable dataset, another frame size or fps than `media`'s (fps
    unchecked with `check_fps` False: a reward service that knows no run), an unknown episode or a
    window past its end. `check_only`: the metadata's checks alone, None returned."""
    from cosmos_rl.data.episodes import EpisodeWindow

    root, episode, start, camera = parse_key(key)
    chunk = media.frames - 1
    if chunk < 1:
        raise ValueError(f"{key!r}: a window needs chunk + 1 >= 2 frames, the run makes {media.frames}")
    try:
        meta = _folder(root, camera).meta
    except UserError as exc:  # DatasetError: the file and the problem, one line
        raise ValueError(f"{key!r}: {exc}") from None
    if check_fps and abs(meta.fps - media.fps) > 1e-6:
        raise ValueError(f"{key!r}: the dataset is recorded at {meta.fps:g} fps, the run's clips are {media.fps:g} fps (set model.fps = {meta.fps:g})")
    if tuple(meta.image_size) != (media.height, media.width):
        height, width = meta.image_size
        raise ValueError(f"{key!r}: the dataset's frames are {height}x{width}, the run makes {media.height}x{media.width} "
                         f"(set model.height = {height}, model.width = {width}: the data is never resized)")  # fmt: skip
    if episode not in meta.episodes:
        shown = f"{min(meta.episodes)}..{max(meta.episodes)}" if meta.episodes else "none"
        raise ValueError(f"{key!r}: the dataset has no episode {episode} (its episodes are {shown})")
    length = meta.lengths[meta.episodes.index(episode)]
    if start + chunk >= length:
        raise ValueError(f"{key!r}: a window of {media.frames} frames at frame {start} runs past the episode's {length} frames")
    if check_only:
        return None
    try:
        made = _episode(root, camera, episode)
    except UserError as exc:
        raise ValueError(f"{key!r}: {exc}") from None
    return EpisodeWindow(episode=made, start=start, chunk=chunk, task=TASK)


def training_keys(root: str | Path, frames: int, stride: int = 1, camera: str = "") -> list[str]:
    """The keys of every `stride`-th window of `frames` frames of every episode of the dataset, in
    the metadata's episode order (module docstring)."""
    if frames < 2 or stride < 1:
        raise ValueError(f"need --frames >= 2 (chunk + 1) and --stride >= 1, got {frames}, {stride}")
    root = str(Path(root).resolve())
    meta = _folder(root, camera).meta
    keys = [window_key(root, episode, start, camera) for episode, length in zip(meta.episodes, meta.lengths)
            for start in range(0, length - frames + 1, stride)]  # fmt: skip
    if not keys:
        raise ValueError(f"{root}: no episode has {frames} frames (the longest has {max(meta.lengths, default=0)}); lower --frames")
    return keys


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos_rl.data.lerobot_windows", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the prompt file to write (.txt)")
    parser.add_argument("--dataset", type=Path, required=True, help="the LeRobot dataset folder (written into each key as an absolute path)")
    parser.add_argument("--frames", type=int, required=True, help="frames per window: the run's model.num_frames (chunk + 1)")
    parser.add_argument("--stride", type=int, default=1, help="frames between window starts; default 1")
    parser.add_argument("--camera", default="", help="the video key of a dataset with several; default: its only one")
    args = parser.parse_args(argv)
    try:
        keys = training_keys(args.dataset, args.frames, args.stride, args.camera)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(f"{key}\n" for key in keys))
    except (UserError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(keys)} window keys ({args.frames} frames each): {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
