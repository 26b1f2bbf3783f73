"""Checksums, legacy (format 1) reads, the resume routine's choices and DCP-compatible key
flattening, in one process on tiny models."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from cosmos_rl.checkpoint import (
    CheckpointError,
    CheckpointManager,
    LRScheduleState,
    ModelState,
    OptimizerState,
    PlainState,
    Selection,
    layout,
    load_dcp,
    read_dcp_metadata,
)
from cosmos_rl.checkpoint.collective import quiet_single_process
from cosmos_rl.checkpoint.dcp_io import flatten_keys


class Net(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(8, 8)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def one_step(model, opt):
    model.lin(torch.randn(3, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def snapshot(model, opt) -> dict[str, torch.Tensor]:
    out = {f"w.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, state in enumerate(opt.state.values()):
        out.update({f"opt.{i}.{k}": v.clone() for k, v in state.items()})
    return out


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def parts(model, opt, progress: dict, cursor: dict) -> dict:
    return {
        layout.POLICY: ModelState(model),
        layout.OPTIMIZER: OptimizerState(model, opt),
        layout.PROGRESS: PlainState(progress),
        layout.DATA_CURSOR: PlainState(cursor),
    }


def two_steps(run_dir: Path):
    """Commit steps 1 and 2 of a tiny run; returns the manager, what step 1 held and the live model."""
    model, opt = Net(0), None
    opt = adam(model)
    manager = CheckpointManager(run_dir, keep=0, run_identity="run-a")
    one_step(model, opt)
    manager.save(1, parts(model, opt, {"step": 1}, {"position": 10}))
    at_step_1 = snapshot(model, opt)
    one_step(model, opt)
    manager.save(2, parts(model, opt, {"step": 2}, {"position": 20}))
    return manager, at_step_1, model


def flip_one_byte(path: Path, needle: bytes, offset: int) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, "the bytes to damage must occur exactly once"
    data[at + offset] ^= 0x10
    path.write_bytes(bytes(data))


def as_format_1(step_dir: Path) -> None:
    """meta.json as format version 1 wrote it: file sizes, no checksums."""
    meta = json.loads((step_dir / "meta.json").read_text())
    meta["format_version"] = 1
    del meta["checksum_algorithm"], meta["checksums"]
    (step_dir / "meta.json").write_text(json.dumps(meta))


def resume_fresh(manager):
    model = Net(7)
    opt = adam(model)
    progress, cursor = {}, {}
    step, meta = manager.resume_latest(parts(model, opt, progress, cursor))
    return step, snapshot(model, opt), progress, cursor


def test_save_records_the_sha256_of_every_file(tmp_path):
    manager, _, _ = two_steps(tmp_path)
    meta = manager.read_meta(2)
    assert meta["format_version"] == 2 and meta["checksum_algorithm"] == "sha256"
    assert set(meta["checksums"]) == set(meta["files"]) and ".metadata" in meta["files"]
    for rel, recorded in meta["checksums"].items():
        assert recorded == hashlib.sha256((manager.step_dir(2) / rel).read_bytes()).hexdigest(), rel


def test_a_flipped_byte_in_tensor_data_falls_back_to_the_previous_checkpoint(tmp_path, capsys):
    manager, at_step_1, model = two_steps(tmp_path / "run")
    shard = next(manager.step_dir(2).glob("*.distcp"))
    size = shard.stat().st_size
    flip_one_byte(shard, model.lin.weight.detach().numpy().tobytes(), offset=5)
    assert shard.stat().st_size == size

    # What the checksum guards against: format 1 (sizes only) loads the damage silently.
    unguarded = tmp_path / "v1" / "checkpoints" / "step_2"
    shutil.copytree(manager.step_dir(2), unguarded)
    as_format_1(unguarded)
    silent = Net(7)
    CheckpointManager(tmp_path / "v1", keep=0).load(2, {layout.POLICY: ModelState(silent)})
    assert not torch.equal(silent.lin.weight, model.lin.weight)

    capsys.readouterr()
    step, loaded, progress, cursor = resume_fresh(manager)
    assert step == 1 and progress == {"step": 1} and cursor == {"position": 10}
    assert_same(loaded, at_step_1)
    err = capsys.readouterr().err
    assert "step_2 cannot be loaded" in err and f"file {shard.name} is damaged: its sha256" in err
    assert manager.committed_steps() == [1]
    assert any(p.name.startswith("step_2.unloadable-") for p in manager.root.iterdir())


def test_a_flipped_byte_in_plain_state_json_falls_back_with_or_without_checksums(tmp_path, capsys):
    for version in (2, 1):
        manager, at_step_1, _ = two_steps(tmp_path / f"v{version}")
        if version == 1:
            for step in (1, 2):
                as_format_1(manager.step_dir(step))
        shard = next(manager.step_dir(2).glob("*.distcp"))
        flip_one_byte(shard, b'{"position": 20}', offset=0)  # "{" -> "k": no longer JSON

        capsys.readouterr()
        step, loaded, progress, cursor = resume_fresh(manager)
        assert step == 1 and progress == {"step": 1} and cursor == {"position": 10}
        assert_same(loaded, at_step_1)
        err = capsys.readouterr().err
        # Format 2 finds it by checksum before DCP reads; format 1 when the JSON fails to decode.
        why = "is damaged: its sha256" if version == 2 else "'data_cursor': plain state does not decode (JSONDecodeError"
        assert "step_2 cannot be loaded" in err and why in err, err


@pytest.mark.parametrize(
    "lr_name, cursor_name", [("lr_schedule", "pair_cursor"), ("schedule", "cursor")], ids=["dpo-v1", "nft-v1"]
)
def test_a_format_1_checkpoint_loads_under_the_new_component_names(tmp_path, lr_name, cursor_name):
    model = Net(0)
    opt = adam(model)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0 / (n + 1))
    for _ in range(3):
        one_step(model, opt)
        schedule.step()
    manager = CheckpointManager(tmp_path, keep=0)
    # The names the format-1 trainers saved under (DPO: lr_schedule/pair_cursor, NFT: schedule/cursor).
    manager.save(3, {
        layout.POLICY: ModelState(model), layout.OPTIMIZER: OptimizerState(model, opt),
        lr_name: LRScheduleState(schedule), cursor_name: PlainState({"position": 30}),
        layout.PROGRESS: PlainState({"step": 3}),
    })  # fmt: skip
    saved = snapshot(model, opt)

    def new_names(model2, opt2, schedule2, cursor2):
        return {
            layout.POLICY: ModelState(model2), layout.OPTIMIZER: OptimizerState(model2, opt2),
            layout.LR_SCHEDULE: LRScheduleState(schedule2), layout.DATA_CURSOR: PlainState(cursor2),
            layout.PROGRESS: PlainState({}),
        }  # fmt: skip

    model2 = Net(5)
    opt2 = adam(model2)
    schedule2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda n: 1.0 / (n + 1))
    cursor2: dict = {}
    with pytest.raises(CheckpointError, match=r"component 'data_cursor' was not saved"):
        manager.load(3, new_names(model2, opt2, schedule2, cursor2))  # format 2 has no aliases

    as_format_1(manager.step_dir(3))
    step, meta = manager.resume_latest(new_names(model2, opt2, schedule2, cursor2))
    assert step == 3 and meta["format_version"] == 1
    assert cursor2 == {"position": 30}
    assert schedule2.last_epoch == 3 and schedule2.get_last_lr() == [1e-2 / 4]
    assert_same(snapshot(model2, opt2), saved)


def test_resume_choices_per_step_refuse_or_skip_the_identity_check(tmp_path, capsys):
    two_steps(tmp_path)
    other = CheckpointManager(tmp_path, keep=0, run_identity="run-b")
    model = Net(7)
    opt = adam(model)
    with pytest.raises(CheckpointError, match=r"none of the 2 committed.*step_2: it belongs to run 'run-a'.*step_1"):
        other.resume_latest(parts(model, opt, {}, {}))

    seen = []

    def another_world(step, meta):  # DPO after a world-size change: identity differs on purpose
        seen.append((step, meta["world_size"]))
        return Selection(parts(model, opt, progress, {}), same_run=False)

    progress: dict = {}
    assert other.resume_latest(another_world)[0] == 2 and progress == {"step": 2} and seen == [(2, 1)]

    def refuse_step_2(step, meta):
        if step == 2:
            raise CheckpointError("step 2 was written by another algorithm")
        return Selection(parts(model, opt, progress, {}), same_run=False)

    capsys.readouterr()
    assert other.resume_latest(refuse_step_2)[0] == 1 and progress == {"step": 1}
    assert "step_2 cannot be loaded, trying an older one: step 2 was written by another algorithm" in capsys.readouterr().err
    assert other.committed_steps() == [1]


def test_flatten_keys_names_entries_as_dcp_does_and_byte_entries_are_placed(tmp_path):
    tree = {
        "a": {
            "w": torch.arange(3.0),
            "groups": [{"lr": 0.1, "params": ["x", "y"]}, {"lr": 0.2, "params": ["z"]}],
            "names": ["p", "q"],
            "pair": (1, 2),
            "nested": [[torch.ones(2)], [3]],
            "n": 4,
        }
    }
    expected = {
        "a.w", "a.groups.0.lr", "a.groups.0.params", "a.groups.1.lr", "a.groups.1.params",
        "a.names", "a.pair", "a.nested.0.0", "a.nested.1", "a.n",
    }  # fmt: skip
    assert set(flatten_keys(tree)) == expected
    with quiet_single_process():
        dcp.save(tree, checkpoint_id=str(tmp_path))
    assert set(read_dcp_metadata(tmp_path).state_dict_metadata) == expected

    template = {
        "a": {
            "w": torch.zeros(3),
            "groups": [{"lr": None, "params": None}, {"lr": None, "params": None}],
            "names": None,
            "pair": None,
            "nested": [[torch.zeros(2)], None],
            "n": None,
        }
    }
    load_dcp(template, tmp_path)
    got = template["a"]
    assert torch.equal(got["w"], torch.arange(3.0)) and torch.equal(got["nested"][0][0], torch.ones(2))
    assert got["groups"] == [{"lr": 0.1, "params": ["x", "y"]}, {"lr": 0.2, "params": ["z"]}]
    assert got["names"] == ["p", "q"] and got["pair"] == (1, 2) and got["nested"][1] == [3] and got["n"] == 4
