"""The torch-free half of checkpoints: step directories, committed-step scanning, meta.json
versions, legacy component names and file checksums."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_rl.commands import report
from cosmos_rl.planning import run_dir as run
from cosmos_rl.checkpoint import integrity, layout

ROOT = Path(__file__).resolve().parents[1]


def test_layout_run_and_report_import_without_torch():
    code = (
        "import sys\n"
        "import cosmos_rl.checkpoint.layout, cosmos_rl.checkpoint.integrity, cosmos_rl.planning.run_dir, cosmos_rl.commands.report\n"
        "from cosmos_rl.checkpoint import CheckpointError, checkpoint_due, COMPONENTS\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "TORCH False" in result.stdout, result.stdout + result.stderr


def make_step(root: Path, name: str, committed: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if committed:
        (folder / layout.COMMIT_MARKER).write_text("0\n")
    return folder


def test_only_committed_step_directories_count(tmp_path, caplog):
    root = tmp_path / "run" / "checkpoints"
    for name in ("step_2", "step_10", "step_0"):
        make_step(root, name)
    make_step(root, "step_12", committed=False)  # a marker-less step: warned about, never counted
    for name in ("step_14.tmp-0a1b", "step_1.deleting-beef", "step_16.unloadable-00ff", "step_07", "notes"):
        make_step(root, name)  # scratch, set aside, not a step name: never counted even with a marker
    (root / "step_18").write_text("a file, not a directory")

    assert layout.committed_steps(root) == [0, 2, 10]
    assert "step_12" in caplog.text and "no COMMITTED marker" in caplog.text
    assert layout.latest_committed(root) == 10
    assert layout.latest_committed(tmp_path / "nowhere") is None
    # run.py and report.py read the same scan.
    assert run.has_committed_checkpoint(tmp_path / "run")
    assert report._committed_steps(root) == (0, 2, 10)
    assert not run.has_committed_checkpoint(tmp_path / "empty")


def write_meta(root: Path, step: int, **fields) -> None:
    folder = make_step(root, f"step_{step}")
    (folder / layout.META_FILE).write_text(json.dumps({"step": step, **fields}))


def test_read_meta_refuses_other_steps_and_unknown_format_versions(tmp_path):
    write_meta(tmp_path, 3, format_version=2)
    assert layout.read_meta(tmp_path, 3)["format_version"] == 2
    write_meta(tmp_path, 4, format_version=3)
    with pytest.raises(layout.CheckpointError, match=r"step_4: meta.json has format_version 3; .*versions 1 to 2"):
        layout.read_meta(tmp_path, 4)
    write_meta(tmp_path, 5, format_version=1)
    (tmp_path / "step_5" / layout.META_FILE).write_text(json.dumps({"step": 6, "format_version": 1}))
    with pytest.raises(layout.CheckpointError, match="step_5: meta.json says step 6"):
        layout.read_meta(tmp_path, 5)
    (tmp_path / "step_5" / layout.META_FILE).write_text('{"step": 5, "format_')
    with pytest.raises(layout.CheckpointError, match=r"step_5: meta.json .*step_5/meta.json is not valid JSON"):
        layout.read_meta(tmp_path, 5)


def test_one_set_of_component_names_and_the_version_1_names_they_replace():
    assert layout.COMPONENTS == ("policy", "old", "ema", "optimizer", "lr_schedule", "data_cursor", "progress", "rng", "pending_rollout")
    dpo_v1 = {"format_version": 1, "components": dict.fromkeys(["policy", "optimizer", "lr_schedule", "pair_cursor", "progress", "rng"])}
    nft_v1 = {"format_version": 1, "components": dict.fromkeys(["policy", "old", "optimizer", "schedule", "cursor", "progress", "rng"])}
    assert [layout.stored_name(dpo_v1, n) for n in ("lr_schedule", "data_cursor", "rng")] == ["lr_schedule", "pair_cursor", "rng"]
    assert [layout.stored_name(nft_v1, n) for n in ("lr_schedule", "data_cursor", "old")] == ["schedule", "cursor", "old"]
    # Version 2 has one name per component: an old name in it is not an alias.
    nft_v2 = {**nft_v1, "format_version": 2}
    assert layout.stored_name(nft_v2, "lr_schedule") == "lr_schedule"


def test_checksums_are_sha256_of_the_whole_file(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    # The FIPS 180-2 test vector for "abc".
    assert integrity.digest(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    big = bytes(range(256)) * 9000  # over two read chunks
    (tmp_path / "big").write_bytes(big)
    assert integrity.digest(tmp_path / "big") == hashlib.sha256(big).hexdigest()


def test_ranks_split_the_hashing_and_together_cover_every_file():
    names = [f"__{i}_0.distcp" for i in range(5)] + [".metadata"]
    shares = [integrity.share(names, rank, 3) for rank in range(3)]
    assert shares[0] == [".metadata", "__2_0.distcp"]
    assert sorted(sum(shares, [])) == sorted(names)


def test_damaged_files_checks_sizes_always_and_checksums_from_version_2(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    good = {"a": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}
    meta = {"format_version": 2, "files": {"a": 3}, "checksum_algorithm": "sha256", "checksums": good}
    assert integrity.damaged_files(tmp_path, meta, 0, 1) == []
    (tmp_path / "a").write_bytes(b"abd")  # same size, one byte changed
    assert integrity.damaged_files(tmp_path, meta, 0, 1) == [
        "file a is damaged: its sha256 is a52d159f262b2c6d..., meta.json recorded ba7816bf8f01cfea..."
    ]
    assert integrity.damaged_files(tmp_path, meta, 1, 2) == []  # rank 1 of 2 hashes no file of one
    assert integrity.damaged_files(tmp_path, {**meta, "format_version": 1}, 0, 1) == []  # v1: sizes only
    assert integrity.damaged_files(tmp_path, {**meta, "files": {"a": 4}}, 0, 1) == ["file a has 3 bytes, expected 4"]
    assert integrity.damaged_files(tmp_path, {**meta, "files": {"b": 1}}, 0, 1) == ["file b is missing"]
