"""Episodes written as a LeRobot codebase v3.0 dataset folder (the layout LeRobot 0.4 writes and
:mod:`cosmos_rl.data.lerobot` reads); torch-free, without the ``lerobot`` package.

What is written, for N episodes of frames H x W:

- ``meta/info.json``: ``codebase_version`` "v3.0", ``robot_type``, ``fps``, totals, ``chunks_size``,
  ``data_path`` / ``video_path`` templates, ``splits`` ({"train": "0:N"}) and ``features``;
- ``data/chunk-000/file-000.parquet`` (a further file each :data:`~cosmos_rl.data.clip_files.MAX_CLIP_FRAMES`
  frames): per frame ``action`` (float32 [A]), ``observation.state`` (float32, what ``robot_state``
  gives, when given), ``Episode.states`` under ``state_key`` (float64, so the world's state comes
  back exact; by default ``observation.environment_state``), ``timestamp``, ``frame_index``,
  ``episode_index``, ``index``, ``task_index``;
- ``videos/<image_key>/chunk-000/file-000.mp4``: the episodes' frames back to back, encoded by
  :func:`~cosmos_rl.data.clip_files.encode_clip` (lossless H.264, so frames read back bit for bit,
  where LeRobot's own default is lossy AV1);
- ``meta/episodes/chunk-000/file-000.parquet``: per episode its ``tasks``, ``length``, data file,
  ``dataset_from_index`` / ``dataset_to_index`` and its video file with ``from_timestamp`` /
  ``to_timestamp``;
- ``meta/tasks.parquet`` (``task_index`` by task, the task as a pandas index as LeRobot writes it)
  and ``meta/stats.json`` (min, max, mean, std, count of each feature; images per channel in [0, 1]).

The folder is written beside the target and renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import av
import numpy as np
import pyarrow as pa

from cosmos_rl.core.errors import UserError
from cosmos_rl.data.clip_files import MAX_CLIP_FRAMES, encode_clip
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot_files import table_bytes, write_bytes
from cosmos_rl.data.lerobot_meta import (ACTION_KEY, CHUNKS_SIZE, CODEBASE_VERSION, DATA_PATH, EPISODES_PATH, INFO_PATH,
                                         STATS_PATH, TASKS_PATH, VIDEO_PATH, fill, finite_fps)

DATA_FILES_MB, VIDEO_FILES_MB = 100, 500  # LeRobot's defaults, recorded in info.json
_ROBOT_STATE = "observation.state"


def write_dataset(root: Union[str, Path], episodes: Sequence[Episode], *, fps: float, robot_type: str,
                  image_key: str = "observation.image", state_key: str = "observation.environment_state",
                  robot_state: Optional[Callable[[Episode], np.ndarray]] = None) -> Path:
    """Write `episodes` (indices 0..N-1, in order; one frame size, action width and state width) as a
    LeRobot v3.0 folder at `root`, which must not exist or be empty. `robot_state(episode)` gives the
    robot's own state [T, S_r] for ``observation.state`` (none: that column is not written)."""
    fps = finite_fps(fps, "write_dataset fps")
    episodes = list(episodes)
    _check_episodes(episodes, fps, state_key)
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UserError(f"{root}: exists and is not an empty folder; write the dataset to a new folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        _write(staging, episodes, fps, robot_type, image_key, state_key, robot_state)
        if root.exists():
            root.rmdir()
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root


def _check_episodes(episodes: list, fps: float, state_key: str) -> None:
    if not episodes:
        raise ValueError("write_dataset needs at least one episode")
    first = episodes[0]
    for position, episode in enumerate(episodes):
        if episode.index != position:
            raise ValueError(f"episode at position {position} has index {episode.index}; number them 0..N-1 in order")
        if episode.frames.shape[1:] != first.frames.shape[1:] or episode.actions.shape[1] != first.actions.shape[1] \
                or episode.states.shape[1] != first.states.shape[1]:
            raise ValueError(f"episode {position}: frames {episode.frames.shape[1:]}, actions {episode.actions.shape[1]}, states "
                             f"{episode.states.shape[1]} differ from episode 0's")
        if abs(episode.fps - fps) > 1e-9:
            raise ValueError(f"episode {position} is at {episode.fps} fps, the dataset at {fps}")
        if not (np.isfinite(episode.actions).all() and np.isfinite(episode.states).all()):
            raise ValueError(f"episode {position} has non-finite actions or states; a dataset stores only finite values")
        if episode.length > MAX_CLIP_FRAMES:
            raise ValueError(f"episode {position} has {episode.length} frames, over MAX_CLIP_FRAMES = {MAX_CLIP_FRAMES}")
    if first.actions.shape[1] < 1:
        raise ValueError("episodes need actions of width >= 1")
    if state_key in (ACTION_KEY, _ROBOT_STATE) or not state_key.startswith("observation."):
        raise ValueError(f"state_key {state_key!r} must be an observation.* key other than {_ROBOT_STATE}")


def _groups(episodes: list) -> list[list]:
    """Episodes grouped into files: each file's video at most MAX_CLIP_FRAMES frames."""
    groups, current, frames = [], [], 0
    for episode in episodes:
        if current and frames + episode.length > MAX_CLIP_FRAMES:
            groups.append(current)
            current, frames = [], 0
        current.append(episode)
        frames += episode.length
    return groups + [current]


def _vectors(rows: np.ndarray, kind) -> pa.Array:
    """[T, W] as a fixed-size list column (what LeRobot's feature of shape [W] is in parquet)."""
    rows = np.ascontiguousarray(rows)
    return pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), type=kind), rows.shape[1])


def _stats(values: np.ndarray) -> dict:
    values = values.astype(np.float64)
    return {"min": values.min(0).tolist(), "max": values.max(0).tolist(), "mean": values.mean(0).tolist(),
            "std": values.std(0).tolist(), "count": [int(len(values))]}


def _write(root: Path, episodes: list, fps: float, robot_type: str, image_key: str, state_key: str, robot_state) -> None:
    tasks = list(dict.fromkeys(e.task for e in episodes))
    task_index = {task: i for i, task in enumerate(tasks)}
    first = episodes[0]
    height, width = first.frames.shape[1:3]
    columns: dict[str, list] = {}
    episode_rows: list[dict] = []
    pix_fmt, total = "", 0
    for number, group in enumerate(_groups(episodes)):
        chunk, file = divmod(number, CHUNKS_SIZE)
        rows: dict[str, list] = {k: [] for k in ("action", _ROBOT_STATE, state_key, "timestamp", "frame_index",
                                                 "episode_index", "index", "task_index")}
        start = 0
        for episode in group:
            t = episode.length
            frame = np.arange(t)
            rows["action"].append(episode.actions.astype(np.float32))
            if robot_state is not None:
                own = np.asarray(robot_state(episode), dtype=np.float32)
                if own.ndim != 2 or len(own) != t:
                    raise ValueError(f"robot_state gave {own.shape} for episode {episode.index}, expected [{t}, S]")
                rows[_ROBOT_STATE].append(own)
            if episode.states.shape[1]:  # a world that records no state has no state column
                rows[state_key].append(episode.states.astype(np.float64))
            rows["timestamp"].append((frame / fps).astype(np.float32))
            rows["frame_index"].append(frame)
            rows["episode_index"].append(np.full(t, episode.index))
            rows["index"].append(total + frame)
            rows["task_index"].append(np.full(t, task_index[episode.task]))
            episode_rows.append({
                "episode_index": episode.index, "tasks": [episode.task], "length": t,
                "data/chunk_index": chunk, "data/file_index": file,
                "dataset_from_index": total, "dataset_to_index": total + t,
                f"videos/{image_key}/chunk_index": chunk, f"videos/{image_key}/file_index": file,
                f"videos/{image_key}/from_timestamp": start / fps, f"videos/{image_key}/to_timestamp": (start + t) / fps,
                "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
            })
            start += t
            total += t
        table = {}
        for key, parts in rows.items():
            if not parts:
                continue
            joined = np.concatenate(parts)
            columns.setdefault(key, []).append(joined)
            if joined.ndim == 2:
                table[key] = _vectors(joined, pa.float64() if key == state_key else pa.float32())
            else:
                table[key] = pa.array(joined, type=pa.float32() if key == "timestamp" else pa.int64())
        write_bytes(root / fill(DATA_PATH, "", chunk_index=chunk, file_index=file), table_bytes(pa.table(table)))
        video = encode_clip(np.concatenate([e.frames for e in group]), fps)
        write_bytes(root / fill(VIDEO_PATH, "", video_key=image_key, chunk_index=chunk, file_index=file), video)
        if not pix_fmt:
            with av.open(root / fill(VIDEO_PATH, "", video_key=image_key, chunk_index=chunk, file_index=file)) as container:
                pix_fmt = container.streams.video[0].codec_context.pix_fmt or ""
    write_bytes(root / fill(EPISODES_PATH, "", chunk_index=0, file_index=0), table_bytes(pa.Table.from_pylist(episode_rows)))
    _write_tasks(root, tasks)
    features = _features(columns, first, fps, height, width, image_key, state_key, pix_fmt)
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(episodes),
        "total_frames": total, "total_tasks": len(tasks), "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILES_MB, "video_files_size_in_mb": VIDEO_FILES_MB,
        "fps": int(fps) if float(fps).is_integer() else fps, "splits": {"train": f"0:{len(episodes)}"},
        "data_path": DATA_PATH, "video_path": VIDEO_PATH, "features": features,
    }
    stats = {key: _stats(np.concatenate(parts).reshape(total, -1)) for key, parts in columns.items()}
    pixels = np.concatenate([e.frames for e in episodes]).reshape(-1, 3) / 255.0
    stats[image_key] = {name: [[[v]] for v in values] if name != "count" else values
                        for name, values in _stats(pixels).items()}  # per channel, shape [3, 1, 1] as LeRobot's
    stats[image_key]["count"] = [total]
    write_bytes(root / INFO_PATH, json.dumps(info, indent=4).encode())
    write_bytes(root / STATS_PATH, json.dumps(stats, indent=4, allow_nan=False).encode())


def _features(columns: dict, first: Episode, fps: float, height: int, width: int, image_key: str, state_key: str,
              pix_fmt: str) -> dict:
    features = {}
    for key, parts in columns.items():
        if parts[0].ndim == 2:
            features[key] = {"dtype": "float64" if key == state_key else "float32", "shape": [parts[0].shape[1]], "names": None}
        else:
            features[key] = {"dtype": "float32" if key == "timestamp" else "int64", "shape": [1], "names": None}
    features[image_key] = {
        "dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
        "info": {"video.height": height, "video.width": width, "video.codec": "h264", "video.pix_fmt": pix_fmt,
                 "video.is_depth_map": False, "video.fps": int(fps) if float(fps).is_integer() else fps,
                 "video.channels": 3, "has_audio": False},
    }
    return features


def _write_tasks(root: Path, tasks: list) -> None:
    # pandas reads this as LeRobot's task table: task_index indexed by the task string.
    pandas = {"index_columns": ["task"], "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                                                              "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
              "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
                          {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None}],
              "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0"}
    table = pa.table({"task_index": pa.array(range(len(tasks)), type=pa.int64()), "task": pa.array(tasks, type=pa.string())})
    table = table.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
    write_bytes(root / TASKS_PATH, table_bytes(table))
