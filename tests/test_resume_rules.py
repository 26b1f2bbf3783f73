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
