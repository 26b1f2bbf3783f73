"""LeRobot-format datasets: a v3.0 round trip (frames exact: the project's encoder is lossless H.264,
so the tolerance is 0), a hand-written v2.1 folder read, and each hostile folder refused by
`check_dataset` with one line naming the file and the episode."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cosmos_rl.core.errors import UserError
from cosmos_rl.data.clip_files import encode_clip
from cosmos_rl.data.episodes import Episode
from cosmos_rl.data.lerobot import open_dataset
from cosmos_rl.data.lerobot_check import check_dataset
from cosmos_rl.data.lerobot_write import write_dataset
from cosmos_rl.data.scan import sample_rows

FIX = "restore the file from the dataset's source or write the dataset again"
LENGTHS = (6, 9, 12)


def _episodes(fps=10.0):
    rng = np.random.default_rng(0)
    return [Episode(index=i, frames=rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8),
                    actions=rng.normal(size=(n, 2)).astype(np.float32), states=rng.normal(size=(n, 5)),
                    task=("push the T", "reach")[i % 2], fps=fps) for i, n in enumerate(LENGTHS)]


@pytest.fixture
def written(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, _episodes(), fps=10, robot_type="pusht", robot_state=lambda e: e.states[:, :2])
    return root


def _render(problems):
    return [p.render() for p in problems]


# ------------------------------------------------------------------------------------ round trip
def test_v30_round_trip_is_exact_and_in_lerobots_layout(written):
    info = json.loads((written / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10 and info["robot_type"] == "pusht"
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 27, 2)
    assert info["features"]["observation.image"]["shape"] == [16, 16, 3]
    assert info["features"]["action"] == {"dtype": "float32", "shape": [2], "names": None}
    data = pq.read_table(written / "data/chunk-000/file-000.parquet")
    assert set(data.column_names) == {"action", "observation.state", "observation.environment_state", "episode_index",
                                      "frame_index", "timestamp", "index", "task_index"}
    assert data["index"].to_pylist() == list(range(27))
    assert data["timestamp"].to_pylist()[6:9] == pytest.approx([0.0, 0.1, 0.2])
    rows = pq.read_table(written / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(r["episode_index"], r["length"], r["tasks"], r["dataset_from_index"], r["dataset_to_index"]) for r in rows] == [
        (0, 6, ["push the T"], 0, 6), (1, 9, ["reach"], 6, 15), (2, 12, ["push the T"], 15, 27)]
    assert [(r["videos/observation.image/from_timestamp"], r["videos/observation.image/to_timestamp"]) for r in rows] == \
        pytest.approx([(0.0, 0.6), (0.6, 1.5), (1.5, 2.7)])
    tasks = pq.read_table(written / "meta/tasks.parquet")
    assert tasks["task"].to_pylist() == ["push the T", "reach"] and tasks["task_index"].to_pylist() == [0, 1]
    stats = json.loads((written / "meta/stats.json").read_text())
    assert stats["action"]["count"] == [27] and len(stats["observation.image"]["mean"]) == 3
    assert (written / "videos/observation.image/chunk-000/file-000.mp4").is_file()

    folder = open_dataset(written)
    meta = folder.meta
    assert (meta.version, meta.fps, meta.action_width, meta.image_size, meta.lengths) == ("v3.0", 10.0, 2, (16, 16), LENGTHS)
    assert meta.state_widths == {"observation.environment_state": 5, "observation.state": 2}
    assert meta.state_key == "observation.environment_state" and meta.tasks == ("push the T", "reach")
    for want in _episodes():
        got = folder.episode(want.index)
        assert np.array_equal(got.frames, want.frames)  # lossless: tolerance 0
        assert np.array_equal(got.actions, want.actions) and got.actions.dtype == np.float32
        assert np.array_equal(got.states, want.states)
        assert (got.task, got.fps, got.index) == (want.task, 10.0, want.index)
    robot = open_dataset(written, state_key="observation.state").episode(1)
    assert np.array_equal(robot.states, _episodes()[1].states[:, :2].astype(np.float32))
    assert check_dataset(written, action_width=2, chunk=4, fps=10, sample=False) == []


def test_write_refuses_a_folder_that_holds_files_and_non_finite_values(written, tmp_path):
    with pytest.raises(UserError, match="exists and is not an empty folder"):
        write_dataset(written, _episodes(), fps=10, robot_type="pusht")
    bad = _episodes()
    bad[1].actions[3, 0] = np.inf
    with pytest.raises(ValueError, match="episode 1 has non-finite actions or states"):
        write_dataset(tmp_path / "other", bad, fps=10, robot_type="pusht")
    assert not (tmp_path / "other").exists()


# ------------------------------------------------------------------------------------------ v2.1
def test_a_hand_written_v21_folder_reads(tmp_path):
    root = tmp_path / "v21"
    episodes = _episodes()
    key = "observation.images.top"
    info = {
        "codebase_version": "v2.1", "robot_type": "koch", "fps": 10, "chunks_size": 2, "total_episodes": 3,
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": {"action": {"dtype": "float32", "shape": [2]}, "observation.state": {"dtype": "float32", "shape": [5]},
                     key: {"dtype": "video", "shape": [3, 16, 16], "names": ["channels", "height", "width"]}},
    }
    (root / "meta").mkdir(parents=True)
    (root / "meta/info.json").write_text(json.dumps(info))
    (root / "meta/tasks.jsonl").write_text('{"task_index": 0, "task": "push the T"}\n{"task_index": 1, "task": "reach"}\n')
    lines = [json.dumps({"episode_index": e.index, "tasks": [e.task], "length": e.length}) for e in episodes]
    (root / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
    for e in episodes:
        chunk = e.index // 2  # chunks_size 2: episode 2 is in chunk 1
        data = root / f"data/chunk-{chunk:03d}/episode_{e.index:06d}.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({  # variable-length lists, as older writers store a vector
            "action": pa.array(e.actions.tolist(), type=pa.list_(pa.float32())),
            "observation.state": pa.array(e.states.astype(np.float32).tolist(), type=pa.list_(pa.float32())),
            "episode_index": pa.array([e.index] * e.length, type=pa.int64()),
            "frame_index": pa.array(range(e.length), type=pa.int64()),
        }), data)
        video = root / f"videos/chunk-{chunk:03d}/{key}/episode_{e.index:06d}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        video.write_bytes(encode_clip(e.frames, 10))
    folder = open_dataset(root)
    assert (folder.meta.version, folder.meta.image_key, folder.meta.state_key, folder.meta.tasks) == (
        "v2.1", key, "observation.state", ("push the T", "reach"))
    for want in episodes:
        got = folder.episode(want.index)
        assert np.array_equal(got.frames, want.frames) and np.array_equal(got.actions, want.actions)
        assert np.array_equal(got.states, want.states.astype(np.float32)) and got.task == want.task
    assert check_dataset(root, action_width=2, chunk=4, sample=False) == []


# ------------------------------------------------------------------------------------- hostile
def _rewrite_data(root, change):
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    actions = np.array(table["action"].to_pylist(), dtype=np.float32)
    change(actions)
    column = pa.FixedSizeListArray.from_arrays(pa.array(actions.reshape(-1)), 2)
    pq.write_table(table.set_column(table.column_names.index("action"), "action", column), path)
    return path


def test_a_damaged_parquet_file_is_named_once_with_its_episodes(written):
    path = written / "data/chunk-000/file-000.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    [line] = _render(check_dataset(written, action_width=2, chunk=4))
    head = f"{path} (episodes 0, 1, 2): data table: not a readable parquet table ("
    assert line.startswith(head) and line.endswith(f"); {FIX}") and "\n" not in line


def test_a_missing_video_is_named_with_its_episodes(written):
    video = written / "videos/observation.image/chunk-000/file-000.mp4"
    video.unlink()
    assert _render(check_dataset(written, action_width=2, chunk=4)) == [f"{video} (episodes 0, 1, 2): video not found; {FIX}"]
    with pytest.raises(UserError) as caught:
        open_dataset(written).episode(1)
    assert str(caught.value) == f"{video} (episode 1): video not found; {FIX}"


def test_an_undecodable_video_and_a_short_one_are_named(written):
    video = written / "videos/observation.image/chunk-000/file-000.mp4"
    video.write_bytes(encode_clip(np.concatenate([e.frames for e in _episodes()])[:20], 10))  # the table has 27
    assert _render(check_dataset(written, action_width=2, chunk=4)) == [
        f"{video} (episode 2): the video holds 5 frame(s) from 1.500s to 2.700s at 10 fps, the table 12; "
        "rewrite the episode so its video and table agree"]
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\xff" * 200)
    [line] = _render(check_dataset(written, action_width=2, chunk=4))  # one file's one problem: listed once
    assert line.startswith(f"{video} (episodes 0, 1, 2): cannot open clip: ") and "\n" not in line
    assert line.endswith("; re-encode it as an mp4 of exactly the expected frames and size (see docs/data.md, \"Clip files\")")


def test_a_wrong_action_width_is_named(written):
    assert _render(check_dataset(written, action_width=3, chunk=4)) == [
        f"{written / 'meta/info.json'}: actions are 2 wide, the embodiment's are 3; use a dataset recorded for this "
        "embodiment, or the embodiment whose actions are 2 wide"]


@pytest.mark.parametrize("value, text", [(float("nan"), "is nan (not finite); drop or repair the episode"),
                                         (float("inf"), "is inf (not finite); drop or repair the episode"),
                                         (-3e7, "is -3e+07, beyond +-1e+06; store actions in the embodiment's units, or drop the episode")])
def test_non_finite_and_absurd_actions_are_named(written, value, text):
    def poison(actions):
        actions[6 + 2, 1] = value  # episode 1 starts at row 6: its frame 2

    path = _rewrite_data(written, poison)
    assert _render(check_dataset(written, action_width=2, chunk=4)) == [f"{path} (episode 1): action 1 of frame 2 {text}"]


@pytest.mark.parametrize("fps", [0, -5, 5000, "ten"])
def test_an_absurd_fps_is_named(written, fps):
    info_path = written / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["fps"] = fps
    info_path.write_text(json.dumps(info))
    assert _render(check_dataset(written, action_width=2, chunk=4)) == [
        f"{info_path}: fps is {fps!r}, expected a number of frames per second in (0, 1000]; set fps to the recording's frame rate"]


def test_the_runs_fps_is_compared(written):
    assert _render(check_dataset(written, action_width=2, chunk=4, fps=15)) == [
        f"{written / 'meta/info.json'}: fps is 10, the run's is 15; set the run's fps to the dataset's or resample the dataset"]


def test_an_episode_too_short_for_one_window_is_named(written):
    data = written / "data/chunk-000/file-000.parquet"
    assert _render(check_dataset(written, action_width=2, chunk=8)) == [
        f"{data} (episode 0): 6 frame(s), fewer than one window of chunk + 1 = 9; drop the episode or lower the chunk"]


def test_a_fifo_as_info_json_is_refused_without_hanging(written):
    info = written / "meta/info.json"
    info.unlink()
    os.mkfifo(info)
    assert _render(check_dataset(written, action_width=2, chunk=4)) == [
        f"{info}: dataset info (meta/info.json) is not a regular file (a folder, FIFO or device); replace it with the file itself"]


def test_a_nul_byte_in_a_path_is_refused(written):
    with pytest.raises(UserError) as caught:
        open_dataset(str(written) + "\x00x")
    assert str(caught.value) == f"{written}\\x00x: a NUL byte in the dataset path; give the folder's path without it"
    info_path = written / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["data_path"] = "data/\x00/file-{file_index:03d}.parquet"
    info_path.write_text(json.dumps(info))
    assert _render(check_dataset(written, action_width=2, chunk=4)) == [
        f"{written}/data/\\x00/file-000.parquet: data table has a NUL byte in its path; fix the path template in meta/info.json"]


def test_a_template_that_leaves_the_folder_or_calls_attributes_is_refused(written):
    info_path = written / "meta/info.json"
    info = json.loads(info_path.read_text())
    for template, text in (("../../etc/{file_index}.parquet", "data table path '../../etc/0.parquet' leaves the dataset folder; "
                                                               "give a path relative to the folder, without '..'"),
                           ("data/{video_key.__class__}.parquet", "path template 'data/{video_key.__class__}.parquet' has a field "
                                                                   "that is not {name} or {name:0Nd}; write the template as LeRobot does")):
        info["data_path"] = template
        info_path.write_text(json.dumps(info))
        assert _render(check_dataset(written, action_width=2, chunk=4)) == [f"{info_path}: {text}"]


def test_sample_reads_a_sample_and_false_reads_every_episode(tmp_path):
    rng = np.random.default_rng(1)
    episodes = [Episode(index=i, frames=rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8),
                        actions=np.zeros((2, 2), np.float32), states=np.zeros((2, 0)), task="t", fps=5.0) for i in range(140)]
    # validate's sample (scan.sample_rows): the first 32 rows and 96 of the other 108 drawn with a fixed seed
    unsampled = next(i for i in range(32, 140) if i not in sample_rows(140, False))
    root = write_dataset(tmp_path / "many", episodes, fps=5, robot_type="t")

    def poison(actions):
        actions[2 * unsampled, 0] = np.nan  # its frame 0

    _rewrite_data(root, poison)
    assert check_dataset(root, action_width=2, chunk=1) == []
    assert _render(check_dataset(root, action_width=2, chunk=1, sample=False)) == [
        f"{root / 'data/chunk-000/file-000.parquet'} (episode {unsampled}): action 0 of frame 0 is nan (not finite); drop or repair the episode"]

