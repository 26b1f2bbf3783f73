"""`validate --data` for a LeRobot-format dataset folder (:mod:`cosmos_rl.data.lerobot`): every problem
as a :class:`~cosmos_rl.core.problems.Problem` naming the file and the episode, nothing raised.

From the metadata, for every episode (cheap): ``meta/info.json`` readable and sane (fps in
(0, 1000], the features a world model needs), the action width equal to the embodiment's, the
fps equal to the run's (when it names one), each episode long enough for one window of
``chunk + 1`` frames, and each data table and video present as a regular file.

Then episodes are read as the run reads them (:meth:`LeRobotFolder.episode`): the table's rows
(a damaged parquet file, a row count other than the episode's length, actions NaN, infinite or
beyond +-1e6) and every frame of the episode's span of its video (missing, undecodable, a frame
count other than the table's). ``sample=True`` reads the episodes :func:`~cosmos_rl.data.scan.sample_rows`
picks (the first 32 and 96 drawn with a fixed seed); ``sample=False`` reads all. One problem of a
file found in several episodes is listed once, naming them. At most ``MAX_LISTED`` problems, then a count.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional, Union

from cosmos_rl.core import schema
from cosmos_rl.core.actions import EMBODIMENT_WIDTHS
from cosmos_rl.core.paths import resolve_path
from cosmos_rl.core.problems import Problem
from cosmos_rl.data.lerobot import LeRobotFolder, open_dataset
from cosmos_rl.data.lerobot_files import DatasetError, shown
from cosmos_rl.data.lerobot_meta import INFO_PATH
from cosmos_rl.data.scan import MAX_LISTED, caption_data, run_media, sample_rows


def check_dataset(root: Union[str, Path], *, action_width: int, chunk: int, fps: Optional[float] = None,
                  sample: bool = True, image_key: Optional[str] = None, state_key: Optional[str] = None) -> list[Problem]:
    """The problems of the dataset at `root` for a run of `action_width` actions and windows of
    `chunk + 1` frames (at `fps`, when given); [] when it is fit to train on."""
    try:
        folder = open_dataset(root, image_key=image_key, state_key=state_key)
    except DatasetError as exc:
        return [Problem(exc.path, exc.problem, fix=exc.fix)]
    found = _Found()
    meta = folder.meta
    info = shown(Path(root) / INFO_PATH)
    if meta.action_width != action_width:
        found.add(info, None, f"actions are {meta.action_width} wide, the embodiment's are {action_width}",
                  f"use a dataset recorded for this embodiment, or the embodiment whose actions are {meta.action_width} wide")
    if fps is not None and abs(meta.fps - fps) > 1e-6 * max(1.0, fps):
        found.add(info, None, f"fps is {meta.fps:g}, the run's is {fps:g}", "set the run's fps to the dataset's or resample the dataset")
    missing = _missing_files(folder, found)
    for index, length in zip(meta.episodes, meta.lengths):
        if length < chunk + 1:
            found.add(shown(folder.ref(index).data), index, f"{length} frame(s), fewer than one window of chunk + 1 = {chunk + 1}",
                      "drop the episode or lower the chunk")
    if meta.action_width == action_width:  # else every episode would repeat the width problem
        for position in sample_rows(len(meta.episodes), not sample):
            ref = folder.ref(meta.episodes[position])
            if ref.data in missing or ref.video in missing:
                continue
            try:
                folder.episode(ref.index)
            except DatasetError as exc:
                found.add(exc.file, exc.episode, exc.problem, exc.fix)
    return found.problems()


def _missing_files(folder: LeRobotFolder, found: "_Found") -> set:
    """Data tables and videos that are not regular files, each reported once with its episodes."""
    users: dict = {}
    for index in folder.meta.episodes:
        ref = folder.ref(index)
        for path, what in ((ref.data, "data table"), (ref.video, "video")):
            users.setdefault((path, what), []).append(index)
    missing = set()
    for (path, what), episodes in users.items():
        try:
            mode = os.stat(path).st_mode
        except OSError:
            problem = f"{what} not found"
        else:
            if stat.S_ISREG(mode):
                continue
            problem = f"{what} is not a regular file (a folder, FIFO or device)"
        missing.add(path)
        for index in episodes:
            found.add(shown(path), index, problem, "restore the file from the dataset's source or write the dataset again")
    return missing


class _Found:
    """Problems keyed by (file, problem, fix), each with the episodes it was found in."""

    def __init__(self):
        self._episodes: dict = {}

    def add(self, file: str, episode: Optional[int], problem: str, fix: str) -> None:
        self._episodes.setdefault((file, problem, fix), []).append(episode)

    def problems(self) -> list[Problem]:
        out = []
        for (file, problem, fix), episodes in self._episodes.items():
            named = [e for e in episodes if e is not None]
            if len(named) == 1:
                file = f"{file} (episode {named[0]})"
            elif named:
                shown_ = ", ".join(map(str, named[:5])) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
                file = f"{file} (episodes {shown_})"
            out.append(Problem(file, problem, fix=fix))
        if len(out) > MAX_LISTED:
            out = out[:MAX_LISTED] + [Problem(out[0].path, f"{len(out) - MAX_LISTED} more problem(s) not listed (the first {MAX_LISTED} are)")]
        return out


def sft_data(config: schema.RunConfig, base: Path, full: bool) -> tuple[list[Problem], list[str]]:
    """SFT's `validate --data`: its LeRobot episodes (the world model), or its image-caption source."""
    if config.rl.data.lerobot:
        return episode_data(config, base, full)
    return caption_data(config, base, full)


def episode_data(config: schema.RunConfig, base: Path, full: bool) -> tuple[list[Problem], list[str]]:
    """`rl.data.lerobot`: the dataset for the run's embodiment, windows of model.num_frames at
    model.fps, its frames at the run's size (the data is never resized)."""
    data, model = config.rl.data, config.model
    width = EMBODIMENT_WIDTHS.get(model.action.embodiment)
    if width is None:  # preflight names the embodiment problem
        return [], []
    root = resolve_path(data.lerobot, base)
    frames, height, size_w = run_media(config)
    camera = data.camera or None
    problems = check_dataset(root, action_width=width, chunk=frames - 1, fps=float(model.fps), sample=not full, image_key=camera)
    try:
        meta = open_dataset(root, image_key=camera).meta
    except DatasetError:
        return problems, []
    if height and size_w and tuple(meta.image_size) != (height, size_w):
        problems.append(Problem(f"rl.data.lerobot ({meta.image_key})", f"frames are {meta.image_size[0]}x{meta.image_size[1]}, the run makes {height}x{size_w}",
                                fix=f"set model.height = {meta.image_size[0]}, model.width = {meta.image_size[1]} (the data is never resized)"))
    read = "every episode" if full else "a sample of episodes"
    return problems, [f"rl.data.lerobot: {meta.episode_count} episode(s), {meta.total_frames} frames at {meta.fps:g} fps, {read} decoded, {len(problems)} problem(s)"]
