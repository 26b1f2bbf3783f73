"""Hostile options and files met by the CLI (issue 24's third hardening round): non-finite numbers,
a resume with no step left, counts past their caps, deep or binary files, wording. Each refusal is one
line, exit 2, naming the option, key or file; nothing is written or launched first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from braceexpand import braceexpand
from typer.testing import CliRunner

from cosmos_rl.planning import run_dir as run
from cosmos_rl.cli import app
from cosmos_rl.commands.options import bind_host
from cosmos_rl.config import load
from cosmos_rl.core.problems import ManifestError
from cosmos_rl.data.tar_index import SHARD_NAMES_MAX, brace_count
from cosmos_rl.dist.addresses import is_loopback

ROOT = Path(__file__).resolve().parent.parent
NFT = str(ROOT / "manifests" / "nft_t2i_smoke.toml")
DPO = str(ROOT / "manifests" / "dpo_t2i_smoke.toml")
HUGE = str(10**30)


def invoke(*args: str, cwd: Path | None = None):
    """The CLI in-process (no torch import for these refusals); `cwd` for commands that write."""
    import os

    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        return CliRunner().invoke(app, list(args))
    finally:
        os.chdir(here)


def refused(result, *needles: str) -> str:
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for needle in needles:
        assert needle in text, text
    return text


def strict_json(text: str):
    """json.loads that refuses JSON's non-standard Infinity/NaN, as every other JSON reader does."""
    def no_constants(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=no_constants)


# ------------------------------------------------------------------------ 1. finite numbers
@pytest.mark.parametrize("override, key", [
    ("rl.guidance=inf", "rl.guidance"), ("rl.beta=nan", "rl.beta"), ("rl.optimizer.lr=-inf", "rl.optimizer.lr"),
    ("rl.optimizer.betas=[0.9, inf]", "rl.optimizer.betas[1]"), ("model.fps=inf", "model.fps"),
])  # fmt: skip
def test_every_float_knob_must_be_finite(override, key):
    text = refused(invoke("validate", NFT, override), f"{key}: must be a finite number")
    assert "inf" in text or "nan" in text


def test_the_specs_own_values_stay_valid():
    assert invoke("validate", NFT, "rl.beta=1000.0", "rl.kl_beta=0.0", "rl.advantage_low=-5.0", "rl.advantage_high=5.0").exit_code == 0
    assert invoke("validate", DPO, "rl.beta=1000.0").exit_code == 0


def test_validate_json_of_a_non_finite_value_is_strict_json():
    result = invoke("validate", NFT, "--json", "rl.beta=nan", "rl.optimizer.betas=[0.9, inf]")
    assert result.exit_code == 2
    problems = strict_json(result.stdout)["problems"]
    got = {p["path"]: p.get("got") for p in problems}
    assert got["rl.beta"] == "nan" and got["rl.optimizer.betas[1]"] == "inf" and got["rl.optimizer.betas"] == [0.9, "inf"]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999"])
def test_float_options_refuse_non_finite_values_before_anything_runs(value, tmp_path):
    refused(invoke("eval", "preset:tiny", "--guidance", value, cwd=tmp_path), "--guidance", "not a finite number")
    refused(invoke("pairs", "mine", "preset:tiny", "--reward", "shapes_partial", "--prompts", "p.txt", "--out", "o",
                   "--guidance", value, cwd=tmp_path), "--guidance")  # fmt: skip
    refused(invoke("reward", "serve", "--revision", "r", "--cpus-per-replica", value), "--cpus-per-replica")
    refused(invoke("reward", "serve", "--revision", "r", "--gpus-per-replica", value), "--gpus-per-replica")
    assert not any(tmp_path.iterdir())  # no eval.json (the old run wrote Infinity into it)


def test_programmatic_guidance_is_checked_too():
    from cosmos_rl.core.errors import UserError
    from cosmos_rl.commands.evaluate import check_sampler_overrides

    with pytest.raises(UserError, match="--guidance: must be >= 0 and finite"):
        check_sampler_overrides(None, float("inf"))
    check_sampler_overrides(20, 7.5)


# ----------------------------------------------------------------- 2. resume with no step left
def _run_at_step(tmp_path: Path, step: int) -> Path:
    config = load.load(DPO, [f'job.output_dir="{tmp_path}"'])
    config, run_dir = run.pin_paths(config, Path(DPO))
    run.prepare_new(config, run_dir)
    committed = run_dir / "checkpoints" / f"step_{step}"
    committed.mkdir(parents=True)
    (committed / "COMMITTED").write_text("")
    return run_dir


@pytest.mark.parametrize("max_steps", [2, 3])
def test_resume_below_the_done_step_is_refused_and_changes_nothing(tmp_path, max_steps):
    run_dir = _run_at_step(tmp_path, 4)
    saved = (run_dir / "manifest.toml").read_bytes()
    result = invoke("resume", str(run_dir), f"rl.max_steps={max_steps}")
    refused(result, "rl.max_steps: the run has already done step 4", f"(got {max_steps})", "rl.max_steps=5 or more")
    assert (run_dir / "manifest.toml").read_bytes() == saved  # rewritten only by a resume that continues
    assert not (run_dir / "logs").exists()  # torchrun never started
    config, notices = run.load_for_resume(run_dir, ["rl.max_steps=5"], exact=True)
    assert config.rl.max_steps == 5 and b"max_steps = 5" in (run_dir / "manifest.toml").read_bytes()


def test_resume_refusal_names_the_step_through_load_for_resume(tmp_path):
    run_dir = _run_at_step(tmp_path, 2)
    with pytest.raises(ManifestError) as info:
        run.load_for_resume(run_dir, ["rl.max_steps=1"], exact=False)
    assert info.value.problems[0].path == "rl.max_steps" and "step 2" in info.value.problems[0].problem


# --------------------------------------------------------------------------------- 3. caps
@pytest.mark.parametrize("pattern", [
    "a", "pairs-{000..009}.tar", "{a,b}{1..3}x", "python{2.{5..7},3.{2,3}}", r"{1\{2,3}", "{a..g..2}", "{4..1}",
    "{2..-1}", "x{,.backup}", "{a..c}{0..10..3}-{x{1,2},y}", "{}", "{a}", "{{a,b}}", "{1..10..0}", "{-05..5}",
])  # fmt: skip
def test_brace_count_is_what_braceexpand_gives(pattern):
    assert brace_count(pattern) == len(list(braceexpand(pattern)))


def test_a_huge_shard_range_is_refused_without_expanding_it():
    from cosmos_rl.core.errors import UserError

    for pattern in ("x-{0..99999999999999}.tar", "x-{0..999}{0..999}{0..9}.tar", "x-{0..1" + "0" * 5000 + "}.tar"):
        with pytest.raises(UserError, match=f"more than {SHARD_NAMES_MAX} shards in all, the cap"):
            brace_count(pattern)
    result = invoke("validate", DPO, "rl.data.synthetic_pairs=0", 'rl.data.shards=["/nowhere/x-{0..99999999999999}.tar"]')
    refused(result, "rl.data.shards[0]:", f"more than {SHARD_NAMES_MAX} shards")


@pytest.mark.parametrize("args, needle", [
    (["eval", "preset:tiny", "--seeds", HUGE], "--seeds: at most 1000"),
    (["eval", "preset:tiny", "--image-size", "100000"], "--image-size: must be in [1, 4096]"),
    (["eval", "preset:tiny", "--sample-steps", HUGE], "--sample-steps: at most 1000"),
    (["eval", "preset:tiny", "--frames", str(4 * 10**20 + 1)], "--frames: at most 257"),
    (["pairs", "mine", "preset:tiny", "--reward", "shapes_partial", "--prompts", "p.txt", "--out", "o", "--samples", HUGE], "--samples: at most 1024"),
])  # fmt: skip
def test_counts_past_their_cap_are_refused_with_the_reason(args, needle, tmp_path):
    text = refused(invoke(*args, cwd=tmp_path), needle)
    assert ":" in text.split(needle, 1)[1]  # the reason follows the cap
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ 4. files and folders
def test_pairs_mine_out_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "p.txt").write_text("a red circle\n")
    taken = tmp_path / "passwd"
    taken.write_text("root:x:0:0\n")
    for out, needle in ((taken, "is a file, not a folder"), (taken / "x", "cannot create the folder")):
        refused(invoke("pairs", "mine", "preset:tiny", "--reward", "shapes_partial", "--prompts", str(tmp_path / "p.txt"),
                       "--out", str(out), "--device", "cpu"), f"--out '{out}'", needle)  # fmt: skip
    assert taken.read_text() == "root:x:0:0\n"


def _deep_toml(depth: int) -> str:
    return "a = " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("depth", [100, 100_000])
def test_a_deeply_nested_manifest_is_one_line_in_validate_eval_and_resume(tmp_path, depth):
    manifest = tmp_path / "deep.toml"
    manifest.write_text(_deep_toml(depth))
    refused(invoke("validate", str(manifest)), "deep.toml: ne")  # "nested too deeply" / "nests values more than 32"
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_1").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_1" / "COMMITTED").write_text("")
    (run_dir / "manifest.toml").write_text(_deep_toml(depth))
    refused(invoke("eval", str(run_dir), "--device", "cpu"), "manifest.toml: ne")
    refused(invoke("resume", str(run_dir)), "manifest.toml: ne")


def test_report_of_deep_metrics_a_deep_eval_json_or_a_binary_manifest_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.toml").write_text("x = 1\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    refused(invoke("report", str(run_dir)), "metrics.jsonl:2: not a metrics row (JSON nested too deeply")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "eval.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(invoke("report", str(run_dir)), "eval.json: JSON nested too deeply")
    (run_dir / "eval" / "eval.json").unlink()
    (run_dir / "manifest.toml").write_bytes(bytes(range(256)))
    refused(invoke("report", str(run_dir)), "manifest.toml: not UTF-8 text")
    refused(invoke("resume", str(run_dir)), "manifest.toml: not UTF-8 text")


def test_a_deep_checkpoint_meta_is_a_checkpoint_error(tmp_path):
    from cosmos_rl.checkpoint import CheckpointError
    from cosmos_rl.checkpoint.layout import read_meta

    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match=r"step_1: meta.json .*meta.json is JSON nested too deeply to read; fix or regenerate it$"):
        read_meta(tmp_path, 1)


def test_deep_data_rows_are_one_line_naming_the_row(tmp_path):
    from cosmos_rl.data.prompt_file import load_prompts
    from cosmos_rl.core.errors import UserError

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UserError, match=r"p.jsonl:2: JSON nested too deeply"):
        load_prompts(prompts)


# ---------------------------------------------------------------------------------- 6. wording
@pytest.mark.parametrize("manifest, override", [(DPO, "grid.gpus_per_node=-1"), (DPO, "grid.nodes=0"),
                                                (NFT, "grid.nodes=0"), (NFT, "grid.gpus_per_node=-1")])
def test_a_count_below_one_is_named_once_and_never_advised_as_a_fix(manifest, override):
    extra = ['grid.device="cuda"'] if manifest == NFT else []
    text = refused(invoke("validate", manifest, override, *extra), f"{override.split('=')[0]}: must be >= 1")
    assert "set it to -1" not in text and "set it to 0" not in text and "Traceback" not in text


def test_a_missing_prompts_file_is_not_found_not_misnamed(tmp_path):
    for args in (["eval", "preset:tiny"], ["pairs", "mine", "preset:tiny", "--reward", "shapes_partial", "--out", "o"]):
        text = refused(invoke(*args, "--prompts", str(tmp_path / "prompts"), cwd=tmp_path), "--prompts", "file not found")
        assert "must end in" not in text


def test_a_bracketed_ipv6_loopback_is_loopback():
    assert bind_host("[::1]") == "::1" and is_loopback(bind_host("[::1]"))
    assert bind_host("127.0.0.1") == "127.0.0.1" and not is_loopback(bind_host("[2001:db8::1]"))
    # Through the CLI: the exposure check passes (it is loopback), so the next check speaks.
    text = refused(invoke("reward", "serve", "--revision", "r", "--host", "[::1]", "--port", "99999"), "--port 99999")
    assert "reachable from other machines" not in text
    refused(invoke("reward", "serve", "--revision", "r", "--host", "[10.1.2.3]", "--port", "8000"), "--host 10.1.2.3 is reachable from other machines")


@pytest.mark.parametrize("args", [["report", "RUN"], ["eval", "preset:tiny"], ["export", "RUN"],
                                  ["pairs", "mine", "preset:tiny", "--reward", "shapes_partial", "--prompts", "p.txt"]])
def test_an_empty_out_is_called_empty_not_dot(args, tmp_path):
    (tmp_path / "p.txt").write_text("a red circle\n")
    text = refused(invoke(*args, "--out", "", cwd=tmp_path), "--out: empty")
    assert "'.'" not in text


def test_the_cli_refusals_stay_one_line_in_a_subprocess(tmp_path):
    """The same as a user meets it (no CliRunner): exit 2, one error line, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", "eval", "preset:tiny", "--seeds", HUGE],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [line for line in proc.stderr.splitlines() if line.startswith("error: --seeds")]


def test_a_hand_edited_non_finite_value_in_a_saved_run_is_refused_by_eval(tmp_path):
    """eval/export/pairs mine read a run's manifest.toml without the whole preflight; the finite rule
    is asked again, so an edited `guidance = inf` never reaches the sampler or eval.json."""
    run_dir = _run_at_step(tmp_path, 1)
    text = (run_dir / "manifest.toml").read_text()
    (run_dir / "manifest.toml").write_text(text.replace("beta = 500.0", "beta = inf"))
    assert "beta = inf" in (run_dir / "manifest.toml").read_text()
    refused(invoke("eval", str(run_dir), "--device", "cpu"), "rl.beta: must be a finite number (got inf)")
    refused(invoke("export", str(run_dir), "--out", str(tmp_path / "model")), "rl.beta: must be a finite number")


def test_eval_of_a_missing_folder_names_the_folders_export_writes(tmp_path):
    """A model folder holds what `cosmos-rl export` writes: text_tokenizer/ (diffusers' name), not tokenizer/."""
    text = refused(invoke("eval", str(tmp_path / "no_such_model")), "no such folder")
    assert "transformer/, vae/, text_tokenizer/, scheduler/" in " ".join(text.split())
