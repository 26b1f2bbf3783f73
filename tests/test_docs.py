"""The manifest reference in docs/ is generated from the config tree and must not drift."""

from pathlib import Path

from cosmos_rl.commands.docs_gen import generate

ROOT = Path(__file__).resolve().parent.parent


def test_manifest_reference_is_current():
    checked_in = (ROOT / "docs" / "manifest.md").read_text()
    assert checked_in == generate(), "docs/manifest.md is stale: run `python -m cosmos_rl.commands.docs_gen > docs/manifest.md`"


def test_reference_lists_every_spec_knob():
    text = generate()
    for key in ("rl.kl_beta", "rl.rollout_seed_clock", "rl.old.update_every", "rl.ref.update_every", "rl.reward.revision",
                "rl.data.cursor_resume", "rl.validation.every", "grid.gpus_per_role", "checkpoint.keep",
                "model.config.parallelism.data_parallel_shard_degree"):
        assert f"| {key} |" in text, key
