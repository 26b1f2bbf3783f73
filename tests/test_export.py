"""`cosmos-rl export`: a run's checkpoint as a model folder that diffusers' stock pipeline loads, that
samples what the run's checkpoint samples, and that a new run or `cosmos-rl eval` names as a model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch
from _inproc import cosmos
from _models_helpers import folder_pipeline

from cosmos_rl.config import load
from cosmos_rl.core.errors import UserError
from cosmos_rl.commands.evaluate import run_eval
from cosmos_rl.commands.export import export_run
from cosmos_rl.models import lora
from cosmos_rl.models.build import build_preset, load_parts

CPU = torch.device("cpu")
SMALL = {"suite": "shapes", "per_task": 1, "seeds": 1, "reward": "brightness", "device": "cpu"}


def _run(tmp_path: Path, name: str, rl: dict, lora_rank: int):
    raw = {
        "job": {"output_dir": str(tmp_path), "name": name, "progress": False},
        "model": {"preset": "tiny", "lora": {"rank": lora_rank, "alpha": 2.0 * max(lora_rank, 1)}},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": rl,
    }
    config = load.structure(raw)
    run_dir = tmp_path / name
    return config, run_dir


@pytest.fixture(scope="module")
def dpo_lora_run(tmp_path_factory):
    """Two DPO steps with a rank-4 LoRA at a large learning rate, so the adapter is far from zero;
    both steps committed (checkpoint.every = 1, keep all), so the --step tests share this run."""
    from cosmos_rl.trainers.dpo import DPOTrainer

    tmp = tmp_path_factory.mktemp("export")
    config, run_dir = _run(tmp, "dpo", {"algorithm": "dpo", "max_steps": 2, "pairs_per_step": 2, "beta": 10.0,
                                         "optimizer": {"lr": 5e-2}, "data": {"synthetic_pairs": 8}}, lora_rank=4)  # fmt: skip
    config = attrs.evolve(config, checkpoint=attrs.evolve(config.checkpoint, every=1))
    trainer = DPOTrainer(config, run_dir, CPU)
    trainer.run()
    (run_dir / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    return run_dir, trainer


def test_merged_lora_weights_give_the_adapted_networks_velocity():
    parts = build_preset("tiny", seed=0)
    network = parts.transformer
    lora.add_adapters(network, 4, 8.0, ["policy"])
    with torch.no_grad():
        for name, tensor in lora.adapter_tensors(network, "policy").items():
            tensor.copy_(torch.randn_like(tensor) * 0.1)  # lora_B is zero when fresh: make the adapter matter
    plain = build_preset("tiny", seed=0).transformer
    plain.load_state_dict(lora.merged_state_dict(network, "policy"), strict=True)
    latents = torch.randn(1, int(network.config.latent_channel), 1, 4, 4)
    from cosmos_rl.models.packing import velocity

    ids = [torch.tensor([1, 2, 3, 4])]
    t = torch.tensor([0.5])
    with torch.no_grad():
        adapted, merged = velocity(network, latents, t, ids), velocity(plain, latents, t, ids)
        with lora.adapters_disabled(network):
            base = velocity(network, latents, t, ids)
    assert torch.allclose(adapted, merged, atol=1e-5)
    assert not torch.allclose(adapted, base, atol=1e-3)  # the adapter changed the network, and the merge kept it


def test_an_exported_lora_run_loads_in_diffusers_and_scores_as_its_checkpoint(dpo_lora_run, tmp_path):
    run_dir, trainer = dpo_lora_run
    done = cosmos("export", run_dir, "--out", tmp_path / "model", "--json")  # in-process (tests/_inproc.py)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["step"] == 2 and summary["lora_merged"] and summary["algorithm"] == "dpo"
    folder = tmp_path / "model"
    pipe = folder_pipeline(folder)  # diffusers' stock pipeline, from the folder alone
    assert not getattr(pipe.transformer, "peft_config", None)
    info = json.loads((folder / "cosmos_rl.json").read_text())
    assert info["exported_from"]["step"] == 2 and info["exported_from"]["run_identity"] == summary["run_identity"]
    exported = run_eval(str(folder), out_dir=tmp_path / "e1", image_size=32, **SMALL)
    checkpoint = run_eval(str(run_dir), out_dir=tmp_path / "e2", sample_steps=20, guidance=3.0, **SMALL)
    assert exported["score"] == pytest.approx(checkpoint["score"], abs=1e-3)
    assert checkpoint["base_score"] != pytest.approx(checkpoint["score"], abs=1e-3)  # the run moved off its base


def test_an_exported_run_is_a_model_path_a_new_run_trains_from(dpo_lora_run, tmp_path):
    run_dir, _ = dpo_lora_run
    export_run(str(run_dir), tmp_path / "model")
    parts = load_parts(tmp_path / "model")
    raw = {
        "job": {"output_dir": str(tmp_path), "name": "again", "progress": False},
        "model": {"path": str(tmp_path / "model"), "lora": {"rank": 4}},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "dpo", "max_steps": 1, "pairs_per_step": 2, "data": {"synthetic_pairs": 4}},
    }
    manifest = tmp_path / "again.toml"
    manifest.write_text(load.to_toml(load.structure(raw)), encoding="utf-8")
    config, problems = load.load_all_problems(manifest, [])
    assert config is not None and not [p.render() for p in problems if p.severity == "error"]
    from cosmos_rl.trainers.dpo import DPOTrainer

    rows = DPOTrainer(config, tmp_path / "again", CPU).run()
    assert rows[-1]["step"] == 1
    assert parts.prompt_template == "chat"


def test_an_sft_vae_run_exports_the_trained_vae_beside_the_base_transformer(tmp_path):
    from cosmos_rl.shapes import Group, Spec, write_shards
    from cosmos_rl.trainers.sft import SFTTrainer

    specs = [Spec((Group("circle", "red"),)), Spec((Group("square", "blue", 2),))]
    shards = [str(p) for p in write_shards(tmp_path / "shards", specs * 2, seed=0)]
    config, run_dir = _run(tmp_path, "vae", {"algorithm": "sft", "train": "vae", "max_steps": 2, "samples_per_step": 2,
                                             "optimizer": {"lr": 1e-2}, "data": {"shards": shards}}, lora_rank=0)  # fmt: skip
    trainer = SFTTrainer(config, run_dir, CPU)
    trainer.run()
    (run_dir / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    summary = export_run(str(run_dir), tmp_path / "model")
    assert summary["trained"] == "the VAE (base transformer)" and not summary["lora_merged"]
    parts = load_parts(tmp_path / "model")
    for key, value in trainer.module.state_dict().items():
        assert torch.equal(parts.vae.state_dict()[key], value), key
    base = build_preset("tiny", seed=0)
    for key, value in base.transformer.state_dict().items():
        assert torch.equal(parts.transformer.state_dict()[key], value), key
    assert any(not torch.equal(base.vae.state_dict()[k], v) for k, v in parts.vae.state_dict().items())


def test_export_refuses_what_it_cannot_write_and_leaves_nothing(dpo_lora_run, tmp_path):
    run_dir, _ = dpo_lora_run
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists and is not an empty folder"):
        export_run(str(run_dir), taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    with pytest.raises(UserError, match="not a run directory"):
        export_run(str(tmp_path), tmp_path / "new")
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(UserError, match="a_file' is a file, not a folder"):
        export_run(str(run_dir), tmp_path / "a_file" / "deeper" / "model")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "manifest.toml").write_text((run_dir / "manifest.toml").read_text())
    with pytest.raises(UserError, match="no committed checkpoint yet"):
        export_run(str(fresh), tmp_path / "new")
    shutil.rmtree(fresh)
    done = cosmos("export", run_dir, "--out", taken)  # in-process (tests/_inproc.py): the exit code and the words are the subject
    assert done.returncode == 2 and "Traceback" not in done.stderr and "already exists" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "taken"]  # no staging folder left behind


def test_a_run_on_a_nano_layout_folder_exports_a_folder_the_stock_pipeline_loads(tmp_path):
    """The GPU user's path at tiny size: a Cosmos3-Nano-layout base folder (sound and action heads,
    the native flow schedule), a LoRA run on it, and its export."""
    from _models_helpers import nano_folder

    from cosmos_rl.trainers.dpo import DPOTrainer

    base = nano_folder(tmp_path / "nano", native_flow_schedule=True)
    raw = {
        "job": {"output_dir": str(tmp_path), "name": "run", "progress": False},
        "model": {"path": str(base), "lora": {"rank": 4, "alpha": 8.0}},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "dpo", "max_steps": 1, "pairs_per_step": 2, "optimizer": {"lr": 5e-2}, "data": {"synthetic_pairs": 4},
               "init_keys_to_skip_loading": ["audio_*", "action_*"]},
    }
    config = load.structure(raw)
    DPOTrainer(config, tmp_path / "run", CPU).run()
    (tmp_path / "run" / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    export_run(str(tmp_path / "run"), tmp_path / "model")
    index = json.loads((tmp_path / "model" / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline" and index["use_native_flow_schedule"] is True
    pipe = folder_pipeline(tmp_path / "model")
    assert not pipe.transformer.config.sound_gen and not pipe.transformer.config.action_gen  # T2I: the heads are not built
    parts = load_parts(tmp_path / "model")
    assert parts.native_flow_schedule and parts.prompt_template == "chat"


def test_step_picks_a_committed_checkpoint_for_eval_and_export_and_names_the_ones_there_are(dpo_lora_run, tmp_path):
    run_dir, _ = dpo_lora_run
    first = run_eval(str(run_dir), out_dir=tmp_path / "e1", step=1, **SMALL)
    last = run_eval(str(run_dir), out_dir=tmp_path / "e2", **SMALL)
    assert (first["step"], last["step"]) == (1, 2) and first["score"] != last["score"]
    assert first["base_score"] == last["base_score"]
    assert export_run(str(run_dir), tmp_path / "model", step=1)["step"] == 1
    exported = run_eval(str(tmp_path / "model"), out_dir=tmp_path / "e3", image_size=32, **SMALL)
    assert exported["score"] == pytest.approx(first["score"], abs=1e-3)
    with pytest.raises(UserError, match=r"--step 3: .* no committed checkpoint at that step; committed: 1, 2"):
        run_eval(str(run_dir), step=3, **SMALL)
    with pytest.raises(UserError, match="--step 3"):
        export_run(str(run_dir), tmp_path / "other", step=3)
    assert not (tmp_path / "other").exists()
    with pytest.raises(UserError, match="is a model, which has no checkpoints"):
        run_eval("preset:tiny", step=1, **SMALL)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_export_cleans_a_killed_exports_staging_and_writes_with_the_users_umask(dpo_lora_run, tmp_path):
    """A SIGKILLed export leaves `.model.export-PID-XXXX/` (no `finally` runs): the next export of the
    same --out removes it once that pid is gone, keeps a live one's and another folder's; the
    finished folder has the modes the umask gives (mkdtemp alone made it 0700, its weights 0600)."""
    run_dir, _ = dpo_lora_run
    dead, alive = _dead_pid(), os.getppid()  # pytest's parent is running
    stale = tmp_path / f".model.export-{dead}-abc123"
    live = tmp_path / f".model.export-{alive}-def456"
    other = tmp_path / f".other.export-{dead}-ghi789"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "part.safetensors").write_bytes(b"x")
    old_mask = os.umask(0o022)
    try:
        lines = []
        export_run(str(run_dir), tmp_path / "model", progress=lines.append)
    finally:
        os.umask(old_mask)
    assert not stale.exists() and live.is_dir() and other.is_dir()
    assert any(str(stale) in line and "killed" in line for line in lines)
    modes = {p.relative_to(tmp_path / "model"): p.stat().st_mode & 0o777 for p in (tmp_path / "model").rglob("*")}
    modes[Path(".")] = (tmp_path / "model").stat().st_mode & 0o777
    weights = [p for p in modes if p.suffix == ".safetensors"]
    assert weights and all(modes[p] == 0o644 for p in weights), modes
    assert all(mode == (0o755 if (tmp_path / "model" / p).is_dir() else 0o644) for p, mode in modes.items()), modes


def test_export_refuses_a_symlinked_out_before_it_opens_the_run(dpo_lora_run, tmp_path, monkeypatch):
    """--out a symbolic link (the finished folder is renamed onto it, which would replace the link):
    refused first, before the run is opened or any model built."""
    import cosmos_rl.evaluation.target as target_mod

    run_dir, _ = dpo_lora_run
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)

    def must_not_open(*args, **kwargs):
        raise AssertionError("the run was opened before --out was judged")

    monkeypatch.setattr(target_mod, "open_run", must_not_open)
    with pytest.raises(UserError, match=r"--out .*link.*is a symbolic link .*pass the folder it points to"):
        export_run(str(run_dir), link)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="is a symbolic link"):
        export_run(str(run_dir), dangling)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "link", "real"] and not any(real.iterdir())


def test_eval_of_an_exported_folder_samples_as_its_run_was_evaluated(dpo_lora_run, tmp_path):
    """The folder's cosmos_rl.json records the run's evaluation sampler ([rl.eval] here: 4 steps,
    guidance 1); `eval FOLDER` uses it (not the bare-model default of 20 steps at guidance 3), so it
    scores what `eval RUN_DIR` scores; --sample-steps / --guidance still override it."""
    run_dir, _ = dpo_lora_run
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    config = load.load(run / "manifest.toml", saved_run=True)
    config = attrs.evolve(config, rl=attrs.evolve(config.rl, eval=attrs.evolve(config.rl.eval, sample_steps=4, guidance=1.0)))
    (run / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")  # [rl.eval] is no part of the identity
    export_run(str(run), tmp_path / "model")
    recorded = json.loads((tmp_path / "model" / "cosmos_rl.json").read_text())["exported_from"]["sampler"]
    assert (recorded["steps"], recorded["guidance"]) == (4, 1.0)
    exported = run_eval(str(tmp_path / "model"), out_dir=tmp_path / "e1", image_size=32, **SMALL)
    checkpoint = run_eval(str(run), out_dir=tmp_path / "e2", **SMALL)
    assert (exported["sampler"]["steps"], exported["sampler"]["guidance"]) == (4, 1.0) == (checkpoint["sampler"]["steps"], checkpoint["sampler"]["guidance"])
    assert exported["score"] == pytest.approx(checkpoint["score"], abs=1e-3)
    overridden = run_eval(str(tmp_path / "model"), out_dir=tmp_path / "e3", image_size=32, sample_steps=2, **SMALL)
    assert (overridden["sampler"]["steps"], overridden["sampler"]["guidance"]) == (2, 1.0)


@pytest.mark.parametrize("info, found", [
    ({"prompt_template": "minimal"}, (20, 3.0)),  # save_parts' folder: no run, the defaults
    ({"exported_from": {"sampler": {"steps": 7, "shift": 3.0, "guidance": 0.0}}}, (7, 0.0)),
    ({"exported_from": {"sampler": {"steps": 0, "guidance": 1.0}}}, "exported_from.sampler must hold steps"),
    ({"exported_from": {"sampler": {"steps": 4, "guidance": "high"}}}, "exported_from.sampler must hold steps"),
    ("[1, 2", "is not valid JSON .*; fix or regenerate it$"),
])  # fmt: skip
def test_a_folders_recorded_sampler_is_read_or_refused_naming_the_file(tmp_path, info, found):
    from cosmos_rl.config.sampler import folder_settings

    (tmp_path / "cosmos_rl.json").write_text(info if isinstance(info, str) else json.dumps(info))
    if isinstance(found, str):
        with pytest.raises(UserError, match=found) as refused:
            folder_settings(tmp_path)
        assert str(tmp_path / "cosmos_rl.json") in str(refused.value)
        return
    settings = folder_settings(tmp_path)
    assert (settings.steps, settings.guidance, settings.shift) == (*found, None)


def test_export_makes_the_missing_parent_folders_of_out(dpo_lora_run, tmp_path, monkeypatch):
    """`cosmos-rl export RUN --out models/x`, as the docs and the closing summary print it, in a
    folder with no models/ yet; the summary says what to run next."""
    run_dir, _ = dpo_lora_run
    done = cosmos("export", run_dir, "--out", "models/x", cwd=tmp_path)  # in-process (tests/_inproc.py), from tmp_path
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / "x" / "transformer").is_dir() and sorted(p.name for p in (tmp_path / "models").iterdir()) == ["x"]
    assert "exported step 2 of" in done.stdout and "cosmos-rl eval models/x" in done.stdout


# ------------------------------------------------------------------------ issue 55: lock, names, signals
def test_an_out_name_not_utf8_or_too_long_is_refused_before_the_run_opens(tmp_path):
    with pytest.raises(UserError, match="more than the 207 a folder name can have"):
        export_run(str(tmp_path / "no_run"), tmp_path / ("a" * 300))
    with pytest.raises(UserError, match="not UTF-8 text"):
        export_run(str(tmp_path / "no_run"), tmp_path / "bad\udcff")  # a non-UTF-8 byte as argv decodes it
    assert list(tmp_path.iterdir()) == []


def test_a_second_export_to_one_out_exits_2_naming_the_first(dpo_lora_run, tmp_path):
    import fcntl

    run_dir, _ = dpo_lora_run
    out = tmp_path / "model"
    lock = os.open(tmp_path / ".model.export.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first export, mid-write
        os.write(lock, b"424242")
        with pytest.raises(UserError, match=r"another export \(pid 424242\) is writing it"):
            export_run(str(run_dir), out)
    finally:
        os.close(lock)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.export.lock"]  # the first's lock, no staging


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_write_exits_75_and_leaves_nothing(dpo_lora_run, tmp_path, monkeypatch, signum):
    from diffusers import Cosmos3OmniPipeline
    from typer.testing import CliRunner

    from cosmos_rl.cli import app

    class Unhandled(Exception):
        pass

    def unhandled(*_):  # without export's own handler the signal lands here: the test fails, pytest lives
        raise Unhandled()

    original = Cosmos3OmniPipeline.save_pretrained

    def save_then_signal(self, folder, **kwargs):
        original(self, folder, **kwargs)
        os.kill(os.getpid(), signum)  # delivered at once, in this (the main) thread
        time.sleep(5)  # a deadline: never reached when the handler raises

    monkeypatch.setattr(Cosmos3OmniPipeline, "save_pretrained", save_then_signal)
    run_dir, _ = dpo_lora_run
    previous = signal.signal(signum, unhandled)
    try:
        result = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(tmp_path / "model")])
    finally:
        signal.signal(signum, previous)
    assert result.exit_code == 75, (result.output, result.exception)
    assert "stopped" in result.output and signal.Signals(signum).name in result.output
    assert list(tmp_path.iterdir()) == []  # no model, no staging folder, no lock file
