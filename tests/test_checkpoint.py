"""Single-process checkpoint tests: round trips, atomic commit, pruning and load failures."""

from __future__ import annotations

import json
import logging
import math
import random

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from cosmos_rl import checkpoint as ckpt
from cosmos_rl.checkpoint import integrity, layout
from cosmos_rl.checkpoint.collective import quiet_single_process
from cosmos_rl.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    CheckpointManager,
    ModelState,
    OptimizerState,
    PlainState,
    RngStreams,
    decode_plain,
    encode_plain,
)
from cosmos_rl.core.errors import UserError


class TinyNet(torch.nn.Module):
    def __init__(self, seed: int, adapter_rank: int = 2):
        super().__init__()
        torch.manual_seed(seed)
        self.base = torch.nn.Linear(6, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.lora_a = torch.nn.Parameter(torch.randn(adapter_rank, 6))
        self.lora_b = torch.nn.Parameter(torch.randn(6, adapter_rank))

    def forward(self, x):
        return self.norm(self.base(x) + x @ self.lora_a.T @ self.lora_b.T)


def trained(seed: int, frozen_base: bool = False):
    model = TinyNet(seed)
    if frozen_base:
        for p in [*model.base.parameters(), *model.norm.parameters()]:
            p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(torch.randn(3, 6)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def fresh(seed: int, frozen_base: bool = False):
    model = TinyNet(seed)
    if frozen_base:
        for p in [*model.base.parameters(), *model.norm.parameters()]:
            p.requires_grad_(False)
    return model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def assert_same_tensors(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def moments(opt):
    return {
        f"{i}.{name}": value
        for i, state in enumerate(opt.state.values())
        for name, value in state.items()
    }


def components(model, opt, plain):
    return {"model": ModelState(model), "optimizer": OptimizerState(model, opt), "train": plain}


def test_round_trip_restores_weights_moments_plain_state_and_rng(tmp_path):
    model, opt = trained(seed=0)
    plain = {"step": 3, "cursor": 17, "seed_contract": {"seed": 7, "clock": "source_row"}}
    manager = CheckpointManager(tmp_path, keep=0, run_identity="abc", algorithm="dpo")
    torch.manual_seed(11)
    random.seed(12)
    np.random.seed(13)
    manager.save(3, {**components(model, opt, plain), "rng": RngStreams()}, {"note": "x"})
    after_save = (torch.rand(4), random.random(), np.random.rand())

    model2, opt2 = fresh(seed=1)
    assert not torch.equal(model2.base.weight, model.base.weight)
    plain2 = {"step": 0}
    torch.manual_seed(99)
    meta = manager.load(3, {**components(model2, opt2, plain2), "rng": RngStreams()})

    assert_same_tensors(model.state_dict(), model2.state_dict())
    assert_same_tensors(moments(opt), moments(opt2))
    assert moments(opt2)  # Adam moments really exist (exp_avg, exp_avg_sq, step)
    assert plain2 == plain
    after_load = (torch.rand(4), random.random(), np.random.rand())
    assert torch.equal(after_save[0], after_load[0])
    assert after_save[1:] == after_load[1:]
    assert meta["step"] == 3 and meta["extra"] == {"note": "x"}


def test_layout_meta_and_marker(tmp_path):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=0, run_identity="run-hash", algorithm="nft")
    path = manager.save(5, components(model, opt, {"step": 5}))
    assert path == tmp_path / "checkpoints" / "step_5"
    assert (path / "COMMITTED").is_file() and (path / ".metadata").is_file()
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 5 and meta["world_size"] == 1
    assert meta["run_identity"] == "run-hash" and meta["algorithm"] == "nft"
    assert sorted(meta["components"]) == ["model", "optimizer", "train"]
    assert meta["files"][".metadata"] == (path / ".metadata").stat().st_size
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_5"]
    assert manager.latest_committed() == 5


def test_directory_without_marker_is_ignored_with_warning(tmp_path, caplog):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=0)
    manager.save(1, components(model, opt, {}))
    (tmp_path / "checkpoints" / "step_9").mkdir()
    with caplog.at_level(logging.WARNING, logger="cosmos_rl.checkpoint"):
        assert manager.latest_committed() == 1
    assert "step_9" in caplog.text and "COMMITTED" in caplog.text


def test_crash_before_commit_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(1, components(model, opt, {"step": 1}))
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    real_write = integrity.write_durably

    def crash_on_marker(path, text):
        if path.name == layout.COMMIT_MARKER:
            raise OSError("disk vanished")
        real_write(path, text)

    monkeypatch.setattr(integrity, "write_durably", crash_on_marker)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    with pytest.raises(CheckpointWriteError, match="disk vanished"):  # a runtime failure: exit 1
        manager.save(2, components(model, opt, {"step": 2}))
    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert any(name.startswith("step_2.tmp-") for name in leftovers)
    assert manager.latest_committed() == 1

    model2, opt2 = fresh(seed=3)
    manager.load(1, components(model2, opt2, {}))
    assert_same_tensors(reference, model2.state_dict())

    monkeypatch.setattr(integrity, "write_durably", real_write)
    manager.save(3, components(model, opt, {"step": 3}))
    # keep=1 pruned step 1 and the crashed scratch directory.
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_3"]


def test_prune_keeps_newest_k_and_zero_keeps_all(tmp_path):
    model, opt = trained(seed=0)
    keep2 = CheckpointManager(tmp_path / "a", keep=2)
    keep_all = CheckpointManager(tmp_path / "b", keep=0)
    for step in (1, 2, 3, 4):
        keep2.save(step, components(model, opt, {}))
        keep_all.save(step, components(model, opt, {}))
    assert keep2.committed_steps() == [3, 4]
    assert keep_all.committed_steps() == [1, 2, 3, 4]
    with pytest.raises(UserError, match="keep"):
        CheckpointManager(tmp_path, keep=-1)


def test_same_step_twice_is_refused(tmp_path):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=0)
    manager.save(2, components(model, opt, {}))
    with pytest.raises(CheckpointError, match="already committed"):
        manager.save(2, components(model, opt, {}))


def test_trainable_only_saves_and_checks_adapter_keys(tmp_path):
    model, opt = trained(seed=0, frozen_base=True)
    manager = CheckpointManager(tmp_path, keep=0)
    parts = {"model": ModelState(model, trainable_only=True), "optimizer": OptimizerState(model, opt)}
    path = manager.save(1, parts)
    saved = set(ckpt.read_dcp_metadata(path).state_dict_metadata)
    assert {k for k in saved if k.startswith("model.")} == {"model.lora_a", "model.lora_b"}

    model2, opt2 = fresh(seed=5, frozen_base=True)
    base_before = model2.base.weight.clone()
    manager.load(1, {"model": ModelState(model2, trainable_only=True), "optimizer": OptimizerState(model2, opt2)})
    assert torch.equal(model2.lora_a, model.lora_a) and torch.equal(model2.lora_b, model.lora_b)
    assert torch.equal(model2.base.weight, base_before)  # frozen weights are not in the checkpoint

    # A changed adapter (an extra trainable tensor) must not load partially.
    model3, _ = fresh(seed=5, frozen_base=True)
    model3.lora_c = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(CheckpointError, match=r"step_1.*model.lora_c"):
        manager.load(1, {"model": ModelState(model3, trainable_only=True)})

    # The strict=False load itself also refuses a state dict that lacks an adapter key.
    with pytest.raises(CheckpointError, match="lora_b"):
        ModelState(model2, trainable_only=True).load_state_dict({"lora_a": model.lora_a.detach()})


def test_missing_data_file_and_corrupt_metadata_name_the_step(tmp_path, capsys):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=0)
    manager.save(1, components(model, opt, {}))
    path2 = manager.save(2, components(model, opt, {}))
    data_file = next(path2.glob("*.distcp"))
    data_file.unlink()
    model2, opt2 = fresh(seed=1)
    with pytest.raises(CheckpointError, match=rf"step_2.*{data_file.name} is missing"):
        manager.load(2, components(model2, opt2, {}))

    index1 = manager.step_dir(1) / ".metadata"
    intact = index1.read_bytes()
    index1.write_bytes(b"garbage")  # truncated: the recorded size no longer matches
    with pytest.raises(CheckpointError, match=r"none of the 2 committed checkpoints.*step_2.*step_1"):
        manager.resume_latest(components(model2, opt2, {}))
    assert manager.committed_steps() == [1, 2]  # nothing loaded, so nothing was set aside

    index1.write_bytes(intact)
    capsys.readouterr()
    step, meta = manager.resume_latest(components(model2, opt2, {}))
    assert (step, meta["step"]) == (1, 1)
    assert_same_tensors(model.state_dict(), model2.state_dict())
    err = capsys.readouterr().err
    assert "checkpoint step_2 cannot be loaded" in err and f"{data_file.name} is missing" in err
    assert "moved the unloadable" in err and len(err.strip().splitlines()) == 2
    assert manager.committed_steps() == [1]
    assert any(p.name.startswith("step_2.unloadable-") for p in manager.root.iterdir())


def test_resume_without_any_committed_checkpoint_says_so(tmp_path):
    manager = CheckpointManager(tmp_path, keep=0)
    (tmp_path / "checkpoints" / "step_3").mkdir(parents=True)  # no marker: does not count
    with pytest.raises(CheckpointError, match="no committed checkpoint to resume from"):
        manager.resume_latest({"progress": {}})


def as_format_1(step_dir):
    """Rewrite a step's meta.json the way format version 1 wrote it: file sizes, no checksums."""
    meta = json.loads((step_dir / "meta.json").read_text())
    meta["format_version"] = 1
    del meta["checksum_algorithm"], meta["checksums"]
    (step_dir / "meta.json").write_text(json.dumps(meta))


def test_corrupt_metadata_of_same_size_is_reported(tmp_path):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=0)
    path = manager.save(1, components(model, opt, {}))
    size = (path / ".metadata").stat().st_size
    (path / ".metadata").write_bytes(b"\0" * size)
    with pytest.raises(CheckpointError, match=r"step_1: file \.metadata is damaged: its sha256"):
        manager.load(1, components(*fresh(seed=1), {}))
    # Format 1 recorded sizes only: the damage is found when the index is parsed.
    as_format_1(path)
    with pytest.raises(CheckpointError, match="step_1.*cannot read DCP metadata"):
        manager.load(1, components(*fresh(seed=1), {}))


def test_model_key_mismatch_lists_keys(tmp_path):
    model, opt = trained(seed=0)
    manager = CheckpointManager(tmp_path, keep=0)
    manager.save(1, {"model": ModelState(model)})
    other = TinyNet(seed=0)
    other.extra = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match=r"step_1.*missing from the checkpoint: model\.extra\.bias, model\.extra\.weight"):
        manager.load(1, {"model": ModelState(other)})
    with pytest.raises(CheckpointError, match=r"component 'ema' was not saved"):
        manager.load(1, {"model": ModelState(TinyNet(0)), "ema": {}})


def test_run_identity_mismatch_is_refused(tmp_path):
    model, opt = trained(seed=0)
    CheckpointManager(tmp_path, keep=0, run_identity="run-a").save(1, {"model": ModelState(model)})
    with pytest.raises(CheckpointError, match="run-a"):
        CheckpointManager(tmp_path, keep=0, run_identity="run-b").load(1, {"model": ModelState(model)})


def test_plain_encoding_is_exact_and_rejects_unstorable_values():
    data = {
        "f": 0.1,
        "tiny": 5e-324,
        "inf": math.inf,
        "big": 2**80,
        "s": "naïve ✓",
        "none": None,
        "flag": True,
        "nested": {"xs": [1, 2.5, "z", (3, 4)], "t": torch.arange(4, dtype=torch.int64)},
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    }
    back = decode_plain(encode_plain(data))
    assert back["f"] == 0.1 and back["tiny"] == 5e-324 and back["inf"] == math.inf
    assert back["big"] == 2**80 and back["s"] == "naïve ✓" and back["none"] is None
    assert back["flag"] is True and back["nested"]["xs"] == [1, 2.5, "z", [3, 4]]
    assert torch.equal(back["nested"]["t"], data["nested"]["t"])
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], data["bf16"])
    with pytest.raises(TypeError, match="nested.obj"):
        encode_plain({"nested": {"obj": object()}})
    with pytest.raises(TypeError, match="not a string"):
        encode_plain({"d": {1: 2}})


def test_unstorable_plain_state_fails_before_writing(tmp_path):
    manager = CheckpointManager(tmp_path, keep=0)
    with pytest.raises(CheckpointError, match="'train'.*set"):
        manager.save(1, {"train": PlainState({"ids": {1, 2}})})
    assert manager.latest_committed() is None


class Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_dcp_byte_entries_are_never_unpickled(tmp_path):
    with quiet_single_process():
        dcp.save({"x": {"obj": Payload(), "w": torch.ones(2)}}, checkpoint_id=str(tmp_path))
    template = {"x": {"obj": None, "w": torch.zeros(2)}}
    with pytest.raises(CheckpointError, match=r"x\.obj: refusing to unpickle.*GLOBAL print"):
        ckpt.load_dcp(template, tmp_path)
    assert template["x"]["obj"] is None


class _Exploit:
    """Unpickling this calls a global that is not a DCP metadata class."""

    def __reduce__(self):
        return (print, ("pwned",))


def test_metadata_index_admits_only_dcp_classes(tmp_path, capsys):
    """torch writes `.metadata` with pickle; a crafted one must not run code on load."""
    import pickle

    model, opt = trained(0)
    manager = CheckpointManager(tmp_path, keep=0)
    manager.save(1, components(model, opt, {"step": 1}))
    metadata = manager.step_dir(1) / ".metadata"
    assert ckpt.read_dcp_metadata(manager.step_dir(1)).state_dict_metadata  # the real index reads fine

    metadata.write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(pickle.UnpicklingError, match="refusing global builtins.print"):
        ckpt.read_dcp_metadata(manager.step_dir(1))
    with pytest.raises(CheckpointError, match="refusing global builtins.print"):
        ckpt.load_dcp({"model": {}}, manager.step_dir(1))
    assert "pwned" not in capsys.readouterr().out


def _dotted_global_call(module: str, dotted_name: str, arg: str) -> bytes:
    """A protocol-4 pickle that calls ``module.<dotted_name>(arg)``: STACK_GLOBAL resolves a
    dotted name as an attribute chain, so an allowed module can lead anywhere it imports."""
    import pickle

    def short(text: str) -> bytes:
        raw = text.encode()
        return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw

    return (
        pickle.PROTO + bytes([4]) + short(module) + short(dotted_name) + pickle.STACK_GLOBAL
        + short(arg) + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP
    )


def test_metadata_index_refuses_dotted_names_under_dcp_modules(tmp_path):
    """`torch.distributed.checkpoint.filesystem` imports `os`, so `os.mkdir` is one dotted name
    away; padded to the recorded size, the crafted index passes the size check and must still
    run nothing, through a direct read, `load_dcp` and the manager's newest-loadable resume."""
    import pickle

    model, opt = trained(0)
    manager = CheckpointManager(tmp_path / "ckpt", keep=0)
    manager.save(1, components(model, opt, {"step": 1}))
    manager.save(2, components(model, opt, {"step": 2}))
    marker = tmp_path / "pwned"
    for module in ("torch.distributed.checkpoint.filesystem", "torch.distributed.checkpoint.metadata"):
        exploit = _dotted_global_call(module, "os.mkdir", str(marker))
        index = manager.step_dir(2) / ".metadata"
        size = index.stat().st_size
        assert len(exploit) < size
        index.write_bytes(exploit + b"\x00" * (size - len(exploit)))
        with pytest.raises(pickle.UnpicklingError, match=r"refusing global .*os\.mkdir"):
            ckpt.read_dcp_metadata(manager.step_dir(2))
        with pytest.raises(CheckpointError, match="refusing global"):
            ckpt.load_dcp({"model": {}}, manager.step_dir(2))
        assert not marker.exists()
    loaded_model, loaded_opt = fresh(0)
    # the crafted step counts as damage: refused with its reason, the one before is the newest loadable
    assert manager.resume_latest(components(loaded_model, loaded_opt, {"step": 0}))[0] == 1
    assert not marker.exists()


def test_checkpoint_cadence():
    """every=2, max 5: steps 2, 4 and the last (5); every=0: only the last."""
    assert [s for s in range(1, 6) if ckpt.checkpoint_due(s, 5, 2)] == [2, 4, 5]
    assert [s for s in range(1, 6) if ckpt.checkpoint_due(s, 5, 0)] == [5]
