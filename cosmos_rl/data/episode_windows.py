"""SFT samples cut from episodes: every window of `chunk + 1` frames of every episode, with the
`chunk` actions taken between them and the episode's task as the caption (the world model's
teacher forcing, docs/world.md).

Windows start at every frame that leaves a whole window (stride 1), episode by episode, in order;
the cursor shuffles them. Frames are taken at the size they are stored: a window whose frames are
not the run's size is refused with both sizes and the fix (the project never resizes data, as for
clips). Decoding an episode is the expensive part, so the last few decoded episodes are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np
import torch

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.captions import CaptionSample
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot import open_dataset

KEPT_EPISODES = 4  # decoded episodes kept: a shuffled cursor revisits few in a row; each is [T, H, W, 3] uint8


class EpisodeWindows:
    """Samples (`CaptionSample` with `actions`) of every window of `media.frames` frames.

    `lengths[i]` is episode i's frame count and `load(i)` decodes it; `origin` names the dataset
    in errors; `action_width` is the embodiment's raw width the actions must have."""

    def __init__(self, lengths: list[int], load: Callable[[int], Episode], media: MediaSpec, action_width: int, origin: str):
        if media.frames < 2:
            raise UserError(f"{origin}: episode windows need clips (model.num_frames >= 2), got {media.frames} frame(s); set model.num_frames = chunk + 1")
        self.media, self.chunk, self.width, self.origin = media, media.frames - 1, action_width, origin
        self._load = load
        self._windows = [(episode, start) for episode, length in enumerate(lengths) for start in range(max(0, length - self.chunk))]
        if not self._windows:
            raise UserError(f"{origin}: no episode has {media.frames} frames (model.num_frames), the longest has {max(lengths, default=0)}; lower model.num_frames")
        self._kept: OrderedDict[int, Episode] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def _episode(self, index: int) -> Episode:
        episode = self._kept.pop(index, None) or self._load(index)
        self._kept[index] = episode
        while len(self._kept) > KEPT_EPISODES:
            self._kept.popitem(last=False)
        return episode

    def caption(self, index: int) -> str:
        return self._episode(self._windows[index][0]).task

    def __getitem__(self, index: int) -> CaptionSample:
        number, start = self._windows[index]
        episode = self._episode(number)
        frames, actions, _ = episode.window(start, self.chunk)
        where = f"{self.origin}: episode {episode.index} frames {start}..{start + self.chunk}"
        if frames.shape[1:3] != (self.media.height, self.media.width):
            raise UserError(
                f"{where}: frames are {frames.shape[1]}x{frames.shape[2]}, the run makes {self.media.height}x{self.media.width}; "
                f"set model.height = {frames.shape[1]}, model.width = {frames.shape[2]} (the data is never resized)"
            )
        if actions.shape[1] != self.width:
            raise UserError(f"{where}: actions are {actions.shape[1]} wide, the embodiment's are {self.width}; check model.action.embodiment")
        if not np.isfinite(actions).all():
            raise UserError(f"{where}: an action is not a finite number; fix or drop the episode")
        clip = torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2).float() / 255.0  # [3, F, H, W]
        return CaptionSample(f"episode {episode.index}/{start}", episode.task, clip, torch.from_numpy(actions.astype(np.float32)))


def lerobot_windows(root: str, camera: str, media: MediaSpec, action_width: int) -> EpisodeWindows:
    """Every window of `media` of a LeRobot-format dataset folder (`rl.data.lerobot`), its frames
    from the video `camera` (empty: the dataset's only one). The dataset's frame rate must be the
    run's (`model.fps`): the caption and the frames' time positions say it."""
    folder = open_dataset(root, image_key=camera or None)
    meta = folder.meta
    if abs(meta.fps - media.fps) > 1e-6:
        raise UserError(f"rl.data.lerobot: {root} is recorded at {meta.fps:g} fps, the run's clips are {media.fps:g} fps; set model.fps = {meta.fps:g}")
    episodes = meta.episodes
    return EpisodeWindows(list(meta.lengths), lambda i: folder.episode(episodes[i]), media, action_width, origin=f"rl.data.lerobot {root}")
