"""The metadata of a LeRobot-format dataset folder (v3.0, v2.1, v2.0; :mod:`cosmos_rl.data.lerobot`
describes both layouts): ``meta/info.json``, the episode and task tables, and where each episode's
rows and frames lie. Read whole (they are small, and capped), checked, and nothing decoded.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional, Union

import attrs
import numpy as np
import pyarrow as pa

from cosmos_rl.data.clip_files import MAX_CLIP_FRAMES, MAX_CLIP_PIXELS
from cosmos_rl.data.lerobot_files import DatasetError, inside, read_jsonl, read_table, shown

CODEBASE_VERSION = "v3.0"
READ_VERSIONS = ("v2.0", "v2.1", "v3.0")
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
V2_EPISODES_PATH = "meta/episodes.jsonl"
V2_TASKS_PATH = "meta/tasks.jsonl"
CHUNKS_SIZE = 1000  # files per chunk folder, LeRobot's default
ACTION_KEY = "action"
STATE_KEYS = ("observation.environment_state", "observation.state")  # state_key's default, in order
MAX_FPS = 1000.0
MAX_ACTION = 1e6  # |a| above this is no unit any embodiment uses: a damaged or unscaled table
MAX_WIDTH = 4096  # of a feature vector
MAX_EPISODES = 10_000_000
FLOATS = ("float16", "float32", "float64")
_FIELD = re.compile(r"\{(\w+)(?::(0?[1-9]?d))?\}")
_TEMPLATE_FIELDS = ("episode_chunk", "episode_index", "chunk_index", "file_index", "video_key")


def fill(template: str, origin: str, **values: Union[int, str]) -> str:
    """A path template of info.json filled with `values` (no attribute access, no other fields)."""
    def one(match: re.Match) -> str:
        name, spec = match.group(1), match.group(2) or ""
        if name not in values:
            raise DatasetError(origin, f"path template {template!r} uses {{{name}}}, which is not one of {', '.join(_TEMPLATE_FIELDS)}",
                               "write the template as LeRobot does")
        return format(values[name], spec) if spec else str(values[name])

    out = _FIELD.sub(one, template)
    if "{" in out or "}" in out:
        raise DatasetError(origin, f"path template {template!r} has a field that is not {{name}} or {{name:0Nd}}",
                           "write the template as LeRobot does")
    return out


@attrs.frozen
class DatasetMeta:
    """What a LeRobot dataset folder says about itself, read without decoding an episode."""

    root: Path
    version: str  # codebase_version: "v3.0", "v2.1" or "v2.0"
    fps: float
    robot_type: Optional[str]
    action_width: int
    state_widths: dict  # feature key -> width, for observation.state / observation.environment_state present
    state_key: Optional[str]  # the feature Episode.states is read from; None: no state (width 0)
    image_keys: tuple  # every video feature
    image_key: str  # the video episodes' frames are read from
    image_size: tuple  # (height, width) of image_key as stored
    episodes: tuple  # episode_index of each episode, in the order the metadata lists them
    lengths: tuple  # frames of each episode, in the same order
    tasks: tuple  # the task strings, by task_index

    @property
    def episode_count(self) -> int:
        return len(self.episodes)

    @property
    def total_frames(self) -> int:
        return sum(self.lengths)


@attrs.frozen
class EpisodeRef:
    """Where one episode lies: its table, its rows' key, its video and the span in it."""

    index: int
    length: int
    task: str
    data: Path
    video: Path
    start: float  # seconds into the video


def finite_fps(value, origin: str) -> float:
    """info.json's fps: a number in (0, MAX_FPS]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= MAX_FPS:
        raise DatasetError(origin, f"fps is {value!r}, expected a number of frames per second in (0, {MAX_FPS:g}]",
                           "set fps to the recording's frame rate")
    return float(value)




def _object(value, origin: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise DatasetError(origin, f"{what} is {type(value).__name__}, expected a JSON object", "restore meta/info.json")
    return value


def _vector(features: dict, key: str, origin: str) -> int:
    """The width of a 1-d numeric feature."""
    feature = _object(features[key], origin, f"feature {key!r}")
    shape, dtype = feature.get("shape"), feature.get("dtype")
    if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) and not isinstance(shape[0], bool)
            and 1 <= shape[0] <= MAX_WIDTH) or dtype not in FLOATS:
        raise DatasetError(origin, f"feature {key!r} is {dtype!r} of shape {shape!r}, expected one of {', '.join(FLOATS)} of shape [N], "
                           f"1 <= N <= {MAX_WIDTH}", "restore meta/info.json")
    return shape[0]


def _video_size(feature, origin: str, key: str) -> tuple[int, int]:
    """(height, width) of a video feature: shape [H, W, 3], or [3, H, W] when its names say channels first."""
    feature = _object(feature, origin, f"feature {key!r}")
    shape, names = feature.get("shape"), feature.get("names")
    ok = isinstance(shape, list) and len(shape) == 3 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
    if ok and isinstance(names, list) and names and names[0] in ("channels", "channel"):
        shape = shape[1:] + shape[:1]
    if not ok or shape[2] != 3 or shape[0] * shape[1] > MAX_CLIP_PIXELS:
        raise DatasetError(origin, f"video feature {key!r} has shape {feature.get('shape')!r}, expected [height, width, 3] of at most "
                           f"{MAX_CLIP_PIXELS} pixels", "restore meta/info.json")
    return shape[0], shape[1]


def _count(value, origin: str, what: str, low: int = 0, high: int = MAX_EPISODES * MAX_CLIP_FRAMES) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= int(value) <= high:
        raise DatasetError(origin, f"{what} is {value!r}, expected an integer in [{low}, {high}]")
    return int(value)


def _seconds(value, origin: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise DatasetError(origin, f"{what} is {value!r}, expected a finite number of seconds >= 0")
    return float(value)


def _task(value, origin: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value[0]  # an episode of several tasks is labelled by its first
    raise DatasetError(origin, f"tasks is {value!r}, expected a list of task strings")


def read_layout(root: Path, info, *, image_key: Optional[str], state_key: Optional[str]) -> tuple[DatasetMeta, dict]:
    """(metadata, {episode_index: EpisodeRef}) from info.json (already parsed) and the episode tables."""
    origin = shown(root / INFO_PATH)
    info = _object(info, origin, "meta/info.json")
    version = info.get("codebase_version")
    if version not in READ_VERSIONS:
        raise DatasetError(origin, f"codebase_version is {version!r}, this reader reads {', '.join(READ_VERSIONS)}",
                           "convert the dataset to v3.0 with LeRobot's converter")
    fps = finite_fps(info.get("fps"), origin)
    features = _object(info.get("features"), origin, "features")
    if ACTION_KEY not in features:
        raise DatasetError(origin, f"no {ACTION_KEY!r} feature (found {', '.join(map(repr, features)) or 'none'})",
                           "a world model needs the actions taken: use a dataset that records them")
    action_width = _vector(features, ACTION_KEY, origin)
    state_widths = {key: _vector(features, key, origin) for key in STATE_KEYS if key in features}
    if state_key is None:
        state_key = next((key for key in STATE_KEYS if key in features), None)
    elif state_key not in features:
        raise DatasetError(origin, f"no feature {state_key!r} to read states from", "name a feature the dataset has")
    elif state_key not in state_widths:
        state_widths[state_key] = _vector(features, state_key, origin)
    image_keys = tuple(key for key, value in features.items() if isinstance(value, dict) and value.get("dtype") == "video")
    if not image_keys:
        raise DatasetError(origin, "no video feature (frames stored as images inside the tables are not read)",
                           "store the camera as video (LeRobot's use_videos=True)")
    if image_key is None:
        if len(image_keys) > 1:
            raise DatasetError(origin, f"several video features ({', '.join(image_keys)})", "name the camera to read with image_key")
        image_key = image_keys[0]
    elif image_key not in image_keys:
        raise DatasetError(origin, f"no video feature {image_key!r} (found {', '.join(image_keys)})", "name one of them")
    image_size = _video_size(features[image_key], origin, image_key)
    chunks_size = _count(info.get("chunks_size"), origin, "chunks_size", 1, MAX_EPISODES)
    templates = {}
    for name in ("data_path", "video_path"):
        if not isinstance(info.get(name), str) or not info[name]:
            raise DatasetError(origin, f"{name} is {info.get(name)!r}, expected a path template", "restore meta/info.json")
        templates[name] = info[name]
    read = _v3_episodes if version == "v3.0" else _v2_episodes
    refs, tasks = read(root, origin, templates, image_key, chunks_size, fps)
    ordered = list(refs.values())
    meta = DatasetMeta(root=root, version=version, fps=fps, robot_type=info.get("robot_type") if isinstance(info.get("robot_type"), str) else None,
                       action_width=action_width, state_widths=state_widths, state_key=state_key, image_keys=image_keys,
                       image_key=image_key, image_size=image_size, episodes=tuple(r.index for r in ordered),
                       lengths=tuple(r.length for r in ordered), tasks=tuple(tasks))
    return meta, refs


def _add(refs: dict, ref: EpisodeRef, origin: str) -> None:
    if ref.index in refs:
        raise DatasetError(origin, f"episode {ref.index} is listed twice")
    if len(refs) >= MAX_EPISODES:
        raise DatasetError(origin, f"more than {MAX_EPISODES} episodes")
    refs[ref.index] = ref


def _v3_episodes(root: Path, origin: str, templates: dict, key: str, chunks_size: int, fps: float):
    table = read_table(root / TASKS_PATH, "task table (meta/tasks.parquet)")
    tasks = _task_names(table, shown(root / TASKS_PATH))
    folder = root / EPISODES_DIR
    files = sorted(folder.glob("chunk-*/file-*.parquet")) if folder.is_dir() else []
    if not files:
        raise DatasetError(shown(folder), "no episode tables (chunk-NNN/file-NNN.parquet)")
    video = f"videos/{key}/"
    columns = ["episode_index", "length", "tasks", "data/chunk_index", "data/file_index", video + "chunk_index",
               video + "file_index", video + "from_timestamp", video + "to_timestamp"]
    refs: dict = {}
    for path in files:
        rows = read_table(path, "episode table", columns).to_pylist()
        for number, row in enumerate(rows):
            where = f"{shown(path)} (row {number})"
            index = _count(row["episode_index"], where, "episode_index", 0, MAX_EPISODES)
            where = f"{shown(path)} (episode {index})"
            length = _count(row["length"], where, "length", 1, MAX_CLIP_FRAMES)
            data = fill(templates["data_path"], origin, chunk_index=_count(row["data/chunk_index"], where, "data/chunk_index"),
                        file_index=_count(row["data/file_index"], where, "data/file_index"))
            clip = fill(templates["video_path"], origin, video_key=key,
                        chunk_index=_count(row[video + "chunk_index"], where, video + "chunk_index"),
                        file_index=_count(row[video + "file_index"], where, video + "file_index"))
            start = _seconds(row[video + "from_timestamp"], where, video + "from_timestamp")
            stop = _seconds(row[video + "to_timestamp"], where, video + "to_timestamp")
            if abs((stop - start) * fps - length) > 0.5:
                raise DatasetError(where, f"the video span {start:g}s..{stop:g}s holds {(stop - start) * fps:.2f} frames at "
                                   f"{fps:g} fps, the episode's length is {length}")
            _add(refs, EpisodeRef(index, length, _task(row["tasks"], where), inside(root, data, "data table"),
                                  inside(root, clip, "video"), start), where)
    return refs, tasks


def _task_names(table: pa.Table, origin: str) -> list[str]:
    """Task strings by task_index; the task is a column or (as pandas writes LeRobot's table) the index."""
    names = table.column_names
    column = next((c for c in ("task", "__index_level_0__") if c in names), None)
    if "task_index" not in names or column is None:
        raise DatasetError(origin, f"columns {', '.join(names)}; expected task_index and task")
    by_index = dict(zip(table.column("task_index").to_pylist(), table.column(column).to_pylist()))
    return [by_index[i] if isinstance(by_index.get(i), str) else "" for i in range(len(by_index))]


def _v2_episodes(root: Path, origin: str, templates: dict, key: str, chunks_size: int, fps: float):
    tasks_path = root / V2_TASKS_PATH
    rows = read_jsonl(tasks_path, "task list (meta/tasks.jsonl)")
    by_index = {row.get("task_index"): row.get("task") for row in rows if isinstance(row, dict)}
    tasks = [by_index[i] if isinstance(by_index.get(i), str) else "" for i in range(len(by_index))]
    path = root / V2_EPISODES_PATH
    refs: dict = {}
    for number, row in enumerate(read_jsonl(path, "episode list (meta/episodes.jsonl)"), start=1):
        where = f"{shown(path)}:{number}"
        if not isinstance(row, dict):
            raise DatasetError(where, "not a JSON object")
        index = _count(row.get("episode_index"), where, "episode_index", 0, MAX_EPISODES)
        where = f"{where} (episode {index})"
        length = _count(row.get("length"), where, "length", 1, MAX_CLIP_FRAMES)
        chunk = index // chunks_size
        data = fill(templates["data_path"], origin, episode_chunk=chunk, episode_index=index)
        clip = fill(templates["video_path"], origin, episode_chunk=chunk, episode_index=index, video_key=key)
        _add(refs, EpisodeRef(index, length, _task(row.get("tasks"), where), inside(root, data, "data table"),
                              inside(root, clip, "video"), 0.0), where)
    if not refs:
        raise DatasetError(shown(path), "lists no episodes")
    return refs, tasks
