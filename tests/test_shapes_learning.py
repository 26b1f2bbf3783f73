"""A short cut of the shipped NFT shapes run (manifests/nft_shapes_cpu.toml) from the shapes base:
after a few steps the held-out score is up on the base's, on the same prompts and noise.

Not a timing test: the run is cut to `STEPS` steps (one process playing the four ranks, as the
Ray group computes them) so it takes about a minute unloaded; the full run's figures are in
docs/results.md."""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.config import load

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "nft_shapes_cpu.toml"
# 12 steps, measured (checkpoints every 4, same eval): held-out gain_partial 0.036 / 0.035 / 0.077 / 0.106 / 0.131
# and strict gain 0.005 / 0.047 / 0.052 / 0.089 / 0.120 at steps 4 / 8 / 12 / 16 / 20; 12 is the first step
# clear of the 0.03 bar with margin (8 clears it by 0.005), at 3/5 of 20 steps' cost.
# (Measured before the manifest's cosine decay, which keeps >= 0.997 x lr over these steps; the test passes with it.)
STEPS = 12


def test_a_short_nft_cut_from_the_shapes_base_raises_the_held_out_score(tmp_path):
    from cosmos_rl.commands.evaluate import run_eval
    from _nft_local import run_local

    overrides = [f"rl.max_steps={STEPS}", "rl.eval.every=0", "rl.sample_grid_every=0", "job.progress=false",
                 f"checkpoint.every={STEPS}", "checkpoint.keep=1", f'job.output_dir="{tmp_path}"', 'job.name="cut"']  # fmt: skip
    config = load.with_absolute_paths(load.load(MANIFEST, overrides), MANIFEST.parent)  # as `cosmos-rl train` does
    run_dir = tmp_path / "cut"
    rows = run_local(config, run_dir)
    assert rows[-1]["step"] == STEPS
    (run_dir / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    # Held-out prompts (none of them trained on), 8 per task x 4 seeds, policy and base on identical noise.
    result = run_eval(str(run_dir), per_task=8, seeds=4)
    assert result["step"] == STEPS and result["n_images"] == 31 * 4
    gain, gain_partial = result["score"] - result["base_score"], result["score_partial"] - result["base_score_partial"]
    assert gain_partial > 0.03, result
    assert gain > 0.0, result


def test_the_shipped_training_prompts_are_what_the_documented_command_writes(tmp_path):
    """manifests/shapes_train.txt = `python -m cosmos_rl.shapes prompts DIR --seed 0 --balanced 1200`,
    and none of its rows is a held-out prompt (rewordings included)."""
    import subprocess
    import sys

    from cosmos_rl.evaluation.prompts import held_out_captions, overlap
    from cosmos_rl.suites import registry as suites

    done = subprocess.run([sys.executable, "-m", "cosmos_rl.shapes", "prompts", str(tmp_path), "--seed", "0", "--balanced", "1200"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shipped = (ROOT / "manifests" / "shapes_train.txt").read_text()
    assert (tmp_path / "train.txt").read_text() == shipped
    shapes = suites.get("shapes")
    assert overlap(shipped.splitlines(), held_out_captions(shapes, 0), shapes) == []
