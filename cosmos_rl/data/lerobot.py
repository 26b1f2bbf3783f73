"""LeRobot-format datasets (the robotics ecosystem's episodes: parquet tables, mp4 videos, ``meta/``)
read as :class:`~cosmos_rl.data.episodes.Episode` values; torch-free.

Read with ``pyarrow`` (parquet) and PyAV (mp4) rather than the ``lerobot`` package: that package
imports torch and torchvision, whose import breaks on this project's machines, and reading the
format needs neither. Written by :func:`cosmos_rl.data.lerobot_write.write_dataset`; checked for
``validate --data`` by :func:`cosmos_rl.data.lerobot_check.check_dataset`.

Two layouts are read, told apart by ``meta/info.json``'s ``codebase_version``:

- **v3.0** (what LeRobot 0.4 writes): ``data/chunk-CCC/file-FFF.parquet`` hold the per-frame rows of
  many episodes; ``videos/<image key>/chunk-CCC/file-FFF.mp4`` hold their frames back to back;
  ``meta/episodes/chunk-CCC/file-FFF.parquet`` has one row per episode (``episode_index``, ``tasks``,
  ``length``, ``data/chunk_index``, ``data/file_index``, and per image key
  ``videos/<key>/chunk_index``, ``file_index``, ``from_timestamp``, ``to_timestamp``: where in its
  video the episode is); ``meta/tasks.parquet`` maps tasks to ``task_index``.
- **v2.0 / v2.1** (many public datasets): one table per episode
  (``data/chunk-CCC/episode_EEEEEE.parquet``), one video per episode and key
  (``videos/chunk-CCC/<key>/episode_EEEEEE.mp4``), ``meta/episodes.jsonl`` and ``meta/tasks.jsonl``;
  the chunk is ``episode_index // chunks_size``.

Both take the file paths from ``info.json``'s ``data_path`` / ``video_path`` templates (only the
fields ``episode_chunk``, ``episode_index``, ``chunk_index``, ``file_index``, ``video_key``, with
integer widths such as ``:03d``; a path that leaves the folder is refused).

Per frame the rows hold ``action`` (the action taken at that frame, width A), ``observation.state``
(the robot's state) and optionally ``observation.environment_state`` (the whole world's state, e.g.
Push-T's block), ``episode_index``, ``frame_index``, ``timestamp``, ``index``, ``task_index``.
``Episode.states`` is read from ``state_key``: by default ``observation.environment_state`` when the
dataset has it, else ``observation.state``, else none (width 0); the choice is in
:attr:`DatasetMeta.state_key`. Frames are decoded at the stored size (the caller resizes) from the
video of ``image_key`` (by default the only video feature; a dataset with several must name one).
Images stored inside the parquet rows (feature dtype ``image``) are not read.

Everything is opened through :mod:`cosmos_rl.data.lerobot_files` (regular files only, size caps,
no NUL bytes, no code run); every problem is a one-line ``DatasetError`` naming the file and episode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cosmos_rl.data.clip_files import read_clip_span
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot_files import DatasetError, open_binary, read_json, read_rows, shown
from cosmos_rl.data.lerobot_meta import ACTION_KEY, INFO_PATH, MAX_ACTION, DatasetMeta, EpisodeRef, read_layout
from cosmos_rl.core.errors import UserError

class LeRobotFolder:
    """A LeRobot dataset folder opened by :func:`open_dataset`: metadata read, episodes decoded on demand."""

    def __init__(self, meta: DatasetMeta, refs: dict):
        self.meta = meta
        self._refs = refs

    def __len__(self) -> int:
        return self.meta.episode_count

    def ref(self, index: int) -> EpisodeRef:
        if index not in self._refs:
            raise UserError(f"{shown(self.meta.root)}: no episode {index} (the dataset's episodes are "
                            f"{_span(self.meta.episodes)}); pick one of them")
        return self._refs[index]

    def episode(self, index: int) -> Episode:
        """Episode `index` (its ``episode_index``): rows from its table, frames decoded from its video."""
        ref = self.ref(index)
        actions, states = self.rows(ref)
        height, width = self.meta.image_size
        origin = f"{shown(ref.video)} (episode {ref.index})"
        try:
            with open_binary(ref.video, "video") as handle:
                frames = read_clip_span(handle, ref.start, ref.length, self.meta.fps, height, width, origin)
        except DatasetError as exc:
            raise exc.of_episode(ref.index) from None
        except UserError as exc:  # the decoder's `origin: problem; fix`, kept apart for check_dataset
            text = str(exc).removeprefix(origin + ": ")
            problem, _, fix = text.rpartition("; ")
            raise DatasetError(shown(ref.video), problem or text, fix or "re-encode the video", ref.index) from None
        return Episode(index=ref.index, frames=frames, actions=actions, states=states, task=ref.task, fps=self.meta.fps)

    def rows(self, ref: EpisodeRef) -> tuple[np.ndarray, np.ndarray]:
        """(actions float32 [T, A], states float64 [T, S]) of an episode, every value checked."""
        try:
            return self._rows(ref)
        except DatasetError as exc:
            raise exc.of_episode(ref.index) from None

    def _rows(self, ref: EpisodeRef) -> tuple[np.ndarray, np.ndarray]:
        origin = shown(ref.data)
        columns = ["frame_index", ACTION_KEY] + ([self.meta.state_key] if self.meta.state_key else [])
        table = read_rows(ref.data, "data table", columns, "episode_index", ref.index)
        if table.num_rows != ref.length:
            raise DatasetError(origin, f"{table.num_rows} frame rows, the episode's metadata says {ref.length}")
        frame_index = _ints(table["frame_index"], origin, "frame_index")
        if not np.array_equal(frame_index, np.arange(ref.length)):
            raise DatasetError(origin, "frame_index is not 0, 1, 2, ... in row order")
        actions = matrix(table[ACTION_KEY], self.meta.action_width, origin, ACTION_KEY).astype(np.float32)
        bad = ~np.isfinite(actions)
        if bad.any():
            row, col = map(int, np.argwhere(bad)[0])
            raise DatasetError(origin, f"action {col} of frame {row} is {actions[row, col]} (not finite)",
                               "drop or repair the episode")
        huge = np.abs(actions) > MAX_ACTION
        if huge.any():
            row, col = map(int, np.argwhere(huge)[0])
            raise DatasetError(origin, f"action {col} of frame {row} is {float(actions[row, col]):g}, beyond +-{MAX_ACTION:g}",
                               "store actions in the embodiment's units, or drop the episode")
        if self.meta.state_key is None:
            states = np.zeros((ref.length, 0), dtype=np.float64)
        else:
            width = self.meta.state_widths[self.meta.state_key]
            states = matrix(table[self.meta.state_key], width, origin, self.meta.state_key).astype(np.float64)
        return actions, states


def _span(indices) -> str:
    return f"{min(indices)}..{max(indices)}" if indices else "none"


def _ints(column, origin: str, name: str) -> np.ndarray:
    if not pa.types.is_integer(column.type) or column.null_count:
        raise DatasetError(origin, f"column {name} is {column.type} with {column.null_count} null(s), expected integers")
    return column.to_numpy()


def matrix(column, width: int, origin: str, name: str) -> np.ndarray:
    """A list column of `width` numbers per row as [rows, width]."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        if width == 1 and (pa.types.is_floating(kind) or pa.types.is_integer(kind)) and not column.null_count:
            return column.to_numpy(zero_copy_only=False).reshape(-1, 1)  # a width-1 feature stored as a scalar
        raise DatasetError(origin, f"column {name} is {kind}, expected a list of {width} numbers per row")
    value_type = kind.value_type
    if not (pa.types.is_floating(value_type) or pa.types.is_integer(value_type)):
        raise DatasetError(origin, f"column {name} holds {value_type}, expected numbers")
    if column.null_count:
        raise DatasetError(origin, f"column {name} has {column.null_count} empty row(s)")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths != width).any():
        row = int(np.argmax(lengths != width))
        raise DatasetError(origin, f"column {name} has {int(lengths[row])} values in frame {row}, info.json declares {width}")
    values = pc.list_flatten(column)
    if values.null_count:
        raise DatasetError(origin, f"column {name} has {values.null_count} null value(s)")
    return values.to_numpy(zero_copy_only=False).reshape(len(column), width)


# ------------------------------------------------------------------------------------- opening
def open_dataset(root: Union[str, Path], *, image_key: Optional[str] = None, state_key: Optional[str] = None) -> LeRobotFolder:
    """Open a LeRobot dataset folder (v3.0, v2.1 or v2.0): its metadata read and checked, nothing decoded."""
    if "\x00" in str(root):
        raise DatasetError(shown(root), "a NUL byte in the dataset path", "give the folder's path without it")
    root = Path(root)
    info = read_json(root / INFO_PATH, "dataset info (meta/info.json)")
    meta, refs = read_layout(root, info, image_key=image_key, state_key=state_key)
    return LeRobotFolder(meta, refs)




__all__ = ["DatasetError", "DatasetMeta", "EpisodeRef", "LeRobotFolder", "matrix", "open_dataset"]
