"""Damaged data met by a run (an image outside validate's sample, a shard cut after validate) stops it
with a UserError naming the file and row, which the worker turns into exit 2 - never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import webdataset as wds

from _image_helpers import bomb_png, png_bytes
from cosmos_rl.config import load
from cosmos_rl.core.errors import UserError
from cosmos_rl.trainers import spmd_launch
from cosmos_rl.trainers.dpo import DPOTrainer
from cosmos_rl.core.errors import EXIT_USAGE as EXIT_USER


def trainer(tmp_path: Path, data: dict) -> DPOTrainer:
    raw = {
        "job": {"output_dir": str(tmp_path), "name": "run", "progress": False},
        "model": {"preset": "tiny"},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "dpo", "max_steps": 1, "pairs_per_step": 2, "data": data},
    }
    return DPOTrainer(load.structure(raw), tmp_path / "run", torch.device("cpu"), resume=False)


def test_a_decompression_bomb_met_in_a_step_names_file_row_and_image(tmp_path):
    for name, data in (("w.png", png_bytes((200, 0, 0), 32)), ("l.png", png_bytes((0, 0, 200), 32)), ("huge.png", bomb_png())):
        (tmp_path / name).write_bytes(data)
    rows = [{"id": "p0", "prompt": "a red square", "winner": "w.png", "loser": "l.png"},
            {"id": "p1", "prompt": "a red square", "winner": "huge.png", "loser": "l.png"}]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = trainer(tmp_path, {"jsonl": str(jsonl)})
    with pytest.raises(UserError, match=r"pairs\.jsonl:2 \(id 'p1'\) winner: .*huge\.png: cannot decode image: too large to decode safely"):
        run.train_step(1)


def test_a_truncated_shard_stops_the_run_before_training_naming_it(tmp_path):
    shard = tmp_path / "pairs.tar"
    with wds.TarWriter(str(shard)) as writer:
        for key in ("k0", "k1"):
            writer.write({"__key__": key, "json": {"id": key, "prompt": "p"}, "winner.png": png_bytes(), "loser.png": png_bytes((0, 0, 255))})
    shard.write_bytes(shard.read_bytes()[:7000])
    with pytest.raises(UserError, match=r"pairs\.tar: truncated"):
        trainer(tmp_path, {"shards": [str(shard)]})


def test_a_rank_that_stopped_on_a_user_error_makes_the_launcher_raise_it(tmp_path):
    # What run_worker writes for a UserError; the CLI prints a UserError and exits 2.
    logs = tmp_path / "logs"
    logs.mkdir()
    message = "/d/pairs.jsonl:2 (id 'p1') winner: /d/huge.png: cannot decode image: too large to decode safely"
    (logs / "rank1.status").write_text(json.dumps({"code": EXIT_USER, "message": message}))
    (logs / "rank0.status").write_text(json.dumps({"code": 1, "message": "rank 0: RuntimeError: Connection closed by peer"}))
    with pytest.raises(UserError) as info:
        spmd_launch._raise_for(tmp_path, 1)
    assert str(info.value) == message
