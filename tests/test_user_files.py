"""Files the user names (issue 55, items 1 and 5): NUL bytes and undecodable names, FIFOs and
devices where a file is expected, and tar members declaring more than their format can need. Each
case is refused with one line naming the key or file; none tracebacks, hangs or reads GiBs.

A call that could block on a FIFO runs in a daemon thread with a deadline (`within`): a regression
fails the test instead of hanging the suite, and the FIFO is then opened for writing so the blocked
open returns and the thread ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from _image_helpers import png_bytes
from cosmos_rl.checkpoint import layout
from cosmos_rl.config import load
from cosmos_rl.core import files
from cosmos_rl.core.errors import UserError
from cosmos_rl.data import first_frame_files
from cosmos_rl.core.files import MAX_CLIP_BYTES
from cosmos_rl.data.jsonl_rows import read_pair_rows
from cosmos_rl.data.prompt_file import read_prompt_rows
from cosmos_rl.data.tar_index import index_shard
from cosmos_rl.data.textfile import read_lines

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 20.0  # generous for a loaded 2-core machine; the calls take milliseconds


def within(call, fifo: Path | None = None):
    """`call()`'s exception (or None), failing the test if it has not returned by DEADLINE_S."""
    box: dict = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        if fifo is not None:  # let the blocked open() return so the thread can end
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{call} still running after {DEADLINE_S} s (blocked on a FIFO or reading without end)")
    return box.get("error")


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


# ---------------------------------------------------------------------------- core/files itself
def test_a_regular_file_is_read_whole(tmp_path):
    (tmp_path / "a.json").write_text('{"x": 1}')
    assert files.read_user_json(tmp_path / "a.json", "key", "thing") == {"x": 1}


@pytest.mark.parametrize("name, words", [("a\x00b", "holds a NUL byte"), ("a\udc80b", "is not valid UTF-8"), ("a\ud800", "is not valid UTF-8")])
def test_names_no_file_can_have_are_refused_by_key(name, words):
    with pytest.raises(UserError) as caught:
        files.read_user_bytes(name, "rl.data.jsonl", "preference JSONL", 100)
    text = str(caught.value)
    assert text.startswith("rl.data.jsonl: the preference JSONL name ") and words in text and "\n" not in text
    assert "\x00" not in text and text.encode("utf-8")  # printable on one line


def test_a_fifo_is_refused_without_blocking(fifo):
    error = within(lambda: files.read_user_bytes(fifo, "--base-eval", "eval.json", 100), fifo)
    assert isinstance(error, UserError) and "is a FIFO (named pipe), not a regular file" in str(error), error


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"), ("/", "a folder")])
def test_devices_and_folders_are_refused(path, kind):
    error = within(lambda: files.read_user_bytes(path, "k", "eval.json", 100))
    assert isinstance(error, UserError) and f"eval.json {path} is {kind}, not a regular file" in str(error), error


def test_a_file_past_the_cap_is_refused_from_its_size(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(10 << 30)  # sparse: 10 GiB declared, nothing stored
    error = within(lambda: files.read_user_json(big, "k", "eval.json", files.MAX_JSON_BYTES))
    assert isinstance(error, UserError) and f"is {10 << 30} bytes, over the {files.MAX_JSON_BYTES}-byte limit" in str(error), error


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(UserError, match=r"^k: prompt file not found: .*nope\.txt; check the path$"):
        files.read_user_bytes(tmp_path / "nope.txt", "k", "prompt file", 100)


# ---------------------------------------------------------------------------- NUL bytes (item 1)
@pytest.mark.parametrize("key", ["job.output_dir", "rl.data.jsonl", "job.name"])
def test_a_manifest_string_with_a_nul_byte_is_a_problem_of_its_key(key):
    """`validate` said OK for these and `train` then raised ValueError from its first open()."""
    _, problems = load.load_all_problems(ROOT / "manifests" / "dpo_shapes_cpu.toml", [f'{key}="a\\u0000b"'])
    mine = [p for p in problems if p.path == key]
    assert mine and "holds a NUL byte" in mine[0].problem, problems


def test_a_prompt_file_with_a_nul_byte_is_a_problem_of_its_key():
    _, problems = load.load_all_problems(ROOT / "manifests" / "nft_shapes_cpu.toml", ['rl.prompts.file="a\\u0000.txt"'])
    assert any(p.path == "rl.prompts.file" and "holds a NUL byte" in p.problem for p in problems), problems


@pytest.mark.parametrize("side", ["winner", "loser"])
def test_a_jsonl_row_naming_a_nul_path_is_a_row_problem(tmp_path, side):
    (tmp_path / "a.png").write_bytes(png_bytes())
    row = {"id": "p", "prompt": "x", "winner": "a.png", "loser": "a.png"}
    row[side] = "b\x00.png"
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    rows, problems = read_pair_rows(tmp_path / "rows.jsonl", 1)  # was: ValueError: embedded null byte
    assert not rows and len(problems) == 1
    assert str(problems[0]).startswith(f"{tmp_path / 'rows.jsonl'}:1: {side}: the image name 'b\\\\x00.png' holds a NUL byte")


def test_a_prompt_row_naming_a_nul_first_frame_is_a_row_problem(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "x", "image": "f\x00.png"}) + "\n")
    rows, problems = read_prompt_rows(tmp_path / "p.jsonl")
    assert not rows and len(problems) == 1 and "holds a NUL byte" in str(problems[0]) and ":1: " in str(problems[0])


# ---------------------------------------------------------------------------- FIFOs (item 1)
def test_an_i2v_first_frame_that_is_a_fifo_is_refused(fifo):
    error = within(lambda: first_frame_files.check_first_frame(fifo, "p.jsonl:3", 32, 32), fifo)
    assert isinstance(error, UserError) and str(error).startswith(f"p.jsonl:3: conditioning image {fifo} is a FIFO"), error


def test_a_data_list_that_is_a_fifo_is_refused(fifo):
    error = within(lambda: read_lines(fifo, "preference JSONL"), fifo)
    assert isinstance(error, UserError) and "is a FIFO" in str(error), error


def test_a_checkpoint_meta_json_that_is_a_fifo_is_refused(tmp_path):
    step = layout.step_dir(tmp_path, 3)
    step.mkdir(parents=True)
    os.mkfifo(step / layout.META_FILE)
    error = within(lambda: layout.read_meta(tmp_path, 3), step / layout.META_FILE)
    assert isinstance(error, layout.CheckpointError) and f"checkpoint {step}: meta.json {step / layout.META_FILE} is a FIFO" in str(error), error


def test_compare_base_eval_fifo_and_dev_zero_are_refused(fifo):
    from cosmos_rl.commands.compare import base_from_eval

    error = within(lambda: base_from_eval(fifo, None, {}), fifo)
    assert isinstance(error, UserError) and str(error).startswith(f"--base-eval: eval.json {fifo} is a FIFO"), error
    error = within(lambda: base_from_eval(Path("/dev/zero"), None, {}))  # was: read until killed at 1.5-3 GB
    assert isinstance(error, UserError) and str(error).startswith("--base-eval: eval.json /dev/zero is a character device"), error


def test_a_latent_cache_entry_that_is_a_fifo_is_a_bad_entry(fifo):
    """safetensors opens a file holding the GIL, so a thread's deadline cannot end a blocked open:
    this one runs in a child process that `timeout` kills."""
    code = ("import sys, torch\n"
            "from cosmos_rl.models.latent_entry import BadEntry, read_entry\n"
            "try:\n    read_entry(sys.argv[1], 'k', 'v', (1,), torch.float32)\n"
            "except BadEntry as exc:\n    print('refused:', exc)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=3 * DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail("reading a latent cache entry that is a FIFO blocked")
    assert done.returncode == 0 and "refused: " in done.stdout and "is a FIFO" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------------------- tar members (item 1)
def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _member(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + bytes(-len(data) % 512)


def _sparse_shard(path: Path, huge: str, declared: int, members: dict[str, bytes]) -> Path:
    """A shard whose `huge` member declares `declared` bytes stored as a hole (the file is sparse),
    then the other members and the end-of-archive blocks: complete as far as tar can tell."""
    with open(path, "wb") as f:
        f.write(_header(huge, declared))
        f.seek(f.tell() + declared + (-declared % 512))
        for name, data in members.items():
            f.write(_member(name, data))
        f.write(bytes(1024))
    return path


def test_a_sparse_json_member_declaring_gibs_is_refused_before_it_is_read(tmp_path):
    shard = _sparse_shard(tmp_path / "s.tar", "k.json", 4 << 30, {"k.winner.png": png_bytes(), "k.loser.png": png_bytes((0, 0, 255))})
    samples, problems = index_shard(shard, 1)  # was: the 4 GiB member read whole (zeros) into memory
    assert not samples and len(problems) == 1
    assert str(problems[0]).startswith(f"{shard} sample 'k': member 'k.json' declares {4 << 30} bytes, over the {files.MAX_METADATA_BYTES}-byte")


@pytest.mark.parametrize("frames, member, limit", [(9, "k.winner.mp4", MAX_CLIP_BYTES), (1, "k.winner.png", None)])
def test_a_sparse_media_member_declaring_gibs_is_refused_at_index(tmp_path, frames, member, limit):
    from cosmos_rl.data.image_files import MAX_IMAGE_BYTES

    limit = limit or MAX_IMAGE_BYTES
    other = "k.loser.mp4" if frames > 1 else "k.loser.png"
    meta = json.dumps({"id": "a", "prompt": "x"}).encode()
    shard = tmp_path / "s.tar"
    with open(shard, "wb") as f:
        f.write(_member("k.json", meta))
        f.write(_header(member, 4 << 30))
        f.seek(f.tell() + (4 << 30))
        f.write(_member(other, b"\0" * 64))
        f.write(bytes(1024))
    samples, problems = index_shard(shard, frames)  # was: indexed, then the 4 GiB read whole by read_blob
    assert not samples and len(problems) == 1
    assert f"member '{member}' declares {4 << 30} bytes, over the {limit}-byte limit" in str(problems[0])
