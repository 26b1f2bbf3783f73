"""The resume rules on the run directory alone: identity diff, world size, non-identity notices."""

from pathlib import Path

import pytest

from cosmos_rl.planning import run_dir as run
from cosmos_rl.config import load
from cosmos_rl.core.problems import ManifestError

ROOT = Path(__file__).resolve().parent.parent


def make_run(tmp_path: Path, manifest: str, *overrides: str) -> Path:
    config = load.load(ROOT / "manifests" / manifest, [f'job.output_dir="{tmp_path}"', *overrides])
    config, run_dir = run.pin_paths(config, ROOT / "manifests" / manifest)
    run.prepare_new(config, run_dir)
    committed = run_dir / "checkpoints" / "step_2"
    committed.mkdir(parents=True)
    (committed / "COMMITTED").write_text("")
    return run_dir


def test_non_identity_changes_are_allowed_with_a_notice_even_when_exact(tmp_path):
    run_dir = make_run(tmp_path, "dpo_t2i_smoke.toml")
    config, notices = run.load_for_resume(run_dir, ["rl.max_steps=500", "checkpoint.every=5"], exact=True)
    assert config.rl.max_steps == 500
    assert any("rl.max_steps: 100 -> 500" in n for n in notices)
    assert any("checkpoint.every: 50 -> 5" in n for n in notices)
    assert "max_steps = 500" in (run_dir / "manifest.toml").read_text()  # the run dir records it


def test_identity_change_is_refused_with_the_diff(tmp_path):
    run_dir = make_run(tmp_path, "dpo_t2i_smoke.toml")
    with pytest.raises(ManifestError) as info:
        run.load_for_resume(run_dir, ["rl.beta=10.0"], exact=False)
    assert info.value.problems[0].render() == (
        "rl.beta: identity field changed on resume (500.0 -> 10.0); resume with the run's own value, or start a new run"
    )


WORLD_1 = ["model.config.parallelism.data_parallel_shard_degree=1", "grid.gpus_per_node=1"]


def test_world_size_change_needs_a_non_exact_dpo_resume(tmp_path):
    run_dir = make_run(tmp_path, "dpo_t2i_smoke.toml")
    with pytest.raises(ManifestError) as info:
        run.load_for_resume(run_dir, WORLD_1, exact=True)
    assert {p.path for p in info.value.problems} == {"model.config.parallelism.data_parallel_shard_degree", "grid.gpus_per_node"}
    config, notices = run.load_for_resume(run_dir, WORLD_1, exact=False)
    assert config.model.config.parallelism.data_parallel_shard_degree == 1
    assert any("DCP reshards" in n for n in notices)


def test_nft_never_changes_world_size_on_resume(tmp_path):
    run_dir = make_run(tmp_path, "nft_t2i_smoke.toml")
    with pytest.raises(ManifestError) as info:
        run.load_for_resume(run_dir, ["rl.group_size=2"], exact=False)
    assert "rl.group_size" in {p.path for p in info.value.problems}


def test_resume_without_a_committed_checkpoint_starts_from_step_0_with_the_saved_manifest(tmp_path):
    """A run stopped before its first checkpoint (preempted while starting) lost nothing: resume
    starts it again, from the manifest it saved, with a notice, and without stale metrics rows."""
    config = load.load(ROOT / "manifests" / "dpo_t2i_smoke.toml", [f'job.output_dir="{tmp_path}"', "rl.beta=123.0"])
    config, run_dir = run.pin_paths(config, ROOT / "manifests" / "dpo_t2i_smoke.toml")
    run.prepare_new(config, run_dir)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    resumed, notices = run.load_for_resume(run_dir, [], exact=True)
    assert resumed.rl.beta == 123.0
    assert any("no committed checkpoint yet: starting from step 0" in n for n in notices)
    assert not (run_dir / "metrics.jsonl").exists()


def test_train_refuses_to_reuse_a_run_directory_with_checkpoints(tmp_path):
    make_run(tmp_path, "dpo_t2i_smoke.toml")
    config = load.load(ROOT / "manifests" / "dpo_t2i_smoke.toml", [f'job.output_dir="{tmp_path}"'])
    with pytest.raises(Exception, match="already holds committed checkpoints"):
        run.prepare_new(*run.pin_paths(config, ROOT / "manifests" / "dpo_t2i_smoke.toml"))


def test_a_relative_output_dir_is_not_reported_as_a_change_on_resume(tmp_path, monkeypatch):
    """The manifests say job.output_dir = "runs"; resume places the run where its folder is, which
    is no change the user made: no notice, and manifest.toml is left as it was."""
    monkeypatch.chdir(tmp_path)
    config = load.load(ROOT / "manifests" / "dpo_t2i_smoke.toml")
    assert config.job.output_dir == "runs"
    config, run_dir = run.pin_paths(config, ROOT / "manifests" / "dpo_t2i_smoke.toml")
    run.prepare_new(config, run_dir)
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_2" / "COMMITTED").write_text("")
    saved = (run_dir / "manifest.toml").read_bytes()
    resumed, notices = run.load_for_resume(run_dir, [], exact=True)
    assert notices == [] and resumed.job.output_dir == str(tmp_path.resolve() / "runs")
    assert (run_dir / "manifest.toml").read_bytes() == saved
    _, notices = run.load_for_resume(run_dir, ["checkpoint.keep=1"], exact=True)
    assert notices == ["changed on resume: checkpoint.keep: 2 -> 1"]  # what the user changed, and only that


def _finished_run(tmp_path: Path, max_steps: int = 2) -> Path:
    """A run directory whose checkpoint step `max_steps` is real (CheckpointManager wrote it with the
    run's identity, sizes and checksums), so every step is done."""
    from cosmos_rl.checkpoint import CheckpointManager, PlainState
    from cosmos_rl.checkpoint.collective import quiet_single_process
    from cosmos_rl.planning import plan

    config = load.load(ROOT / "manifests" / "dpo_t2i_smoke.toml", [f'job.output_dir="{tmp_path}"', f"rl.max_steps={max_steps}"])
    config, run_dir = run.pin_paths(config, ROOT / "manifests" / "dpo_t2i_smoke.toml")
    run.prepare_new(config, run_dir)
    saved = load.load(run_dir / "manifest.toml", saved_run=True)  # what the trainer builds its identity from
    with quiet_single_process():
        CheckpointManager(run_dir, 2, run_identity=plan.run_identity(saved), algorithm="dpo").save(
            max_steps, {"progress": PlainState({"step": max_steps})})
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.7, "time/step_s": 1.0}\n'
                                           '{"step": 2, "train/loss": 0.5, "train/dpo_accuracy": 0.75, "time/step_s": 1.0}\n')
    return run_dir


def test_a_resume_with_every_step_done_starts_no_backend_and_prints_the_summary(tmp_path):
    from typer.testing import CliRunner

    from cosmos_rl.cli import app

    run_dir = _finished_run(tmp_path)
    result = CliRunner().invoke(app, ["resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert not (run_dir / "logs").exists()  # torchrun never started (it would write logs/rank*.status)
    out = result.output
    assert f"nothing left to do: {run_dir} has done all 2 steps (checkpoint step_2 is committed and intact)" in out
    assert "final metrics (step 2): train/dpo_accuracy 0.75  train/loss 0.5\n" in out  # time/ left out
    assert f"checkpoint:  {run_dir / 'checkpoints' / 'step_2'}" in out
    for command in (f"cosmos-rl eval {run_dir}", f"cosmos-rl report {run_dir}", f"cosmos-rl export {run_dir} --out models/dpo_t2i_smoke",
                    f"cosmos-rl resume {run_dir} rl.max_steps=4"):  # fmt: skip
        assert command in out
    assert "changed on resume" not in out


def test_a_finished_runs_damaged_last_checkpoint_still_goes_to_the_backend(tmp_path):
    """The newest step must be intact to count as done; a damaged one is the backend's to set aside
    and train again, as before."""
    run_dir = _finished_run(tmp_path)
    config, _ = run.load_for_resume(run_dir, [], exact=True)
    assert run.nothing_left(run_dir, config) == 2
    assert run.nothing_left(run_dir, attrs_evolve_max_steps(config, 3)) is None  # a step left to train
    damaged = next(p for p in sorted((run_dir / "checkpoints" / "step_2").rglob("*"))
                   if p.is_file() and p.name not in ("meta.json", "COMMITTED") and p.stat().st_size)
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    assert run.nothing_left(run_dir, config) is None


def attrs_evolve_max_steps(config, steps):
    import attrs

    return attrs.evolve(config, rl=attrs.evolve(config.rl, max_steps=steps))
