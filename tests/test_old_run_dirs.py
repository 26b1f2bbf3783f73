"""Run directories written by an older cosmos-rl still load: `cosmos-rl eval`, `export` and
`resume --exact` of the committed fixtures in tests/fixtures/old_runs/ (a DPO LoRA run and an NFT
LoRA run of commit 2b69029, whose NFT checkpoints keyed the adapters without the adapter's name;
the README there says how they were written) give the numbers that code gave.

`expected.json` beside them holds those numbers; running this file as a script with the old code
on PYTHONPATH writes it again (`python tests/test_old_run_dirs.py OUT.json`, from a scratch folder).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "old_runs"
EXPECTED = FIXTURES / "expected.json"
RUNS = ("dpo_lora", "nft_lora")
# One prompt per task, one seed, 4 sampler steps (the NFT run's own; DPO keeps its guidance 3), a
# reward that moves with the weights (the tiny model's images score 0 under the shapes verifier).
EVAL = {"reward": "brightness", "per_task": 1, "seeds": 1, "sample_steps": 4, "device": "cpu"}
EVAL_KEYS = ("step", "score", "base_score", "tasks", "base_tasks", "sampler", "image_size")
EXPORT_KEYS = ("step", "algorithm", "run_identity", "lora_merged", "trained", "sampler")


def _copy(name: str, dest: Path) -> Path:
    """A writable copy of one fixture run (a test never writes into tests/fixtures/)."""
    run = dest / name
    shutil.copytree(FIXTURES / name, run)
    return run


def eval_numbers(run: Path, out: Path) -> dict:
    from cosmos_rl.commands.evaluate import run_eval

    result = run_eval(str(run), out_dir=out, **EVAL)
    return {key: result[key] for key in EVAL_KEYS}


def weights_digest(folder: Path) -> str:
    """sha256 over every tensor of an exported model folder's safetensors files (name, dtype, shape, bytes)."""
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for path in sorted(folder.glob("*/*.safetensors")):
        tensors = load_file(str(path))
        for key in sorted(tensors):
            tensor = tensors[key].contiguous()
            digest.update(f"{path.parent.name}/{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def export_numbers(run: Path, out: Path) -> dict:
    from cosmos_rl.commands.export import export_run

    summary = export_run(str(run), out)
    return {"summary": {key: summary[key] for key in EXPORT_KEYS}, "weights_sha256": weights_digest(out)}


def rows(run: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock keys."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not (k.startswith("time/") or k.endswith("_per_s"))}
        for line in lines
        if line.strip()
    ]


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(EXPECTED.read_text())


@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_evaluates_to_the_old_codes_scores(name, expected, tmp_path):
    run = _copy(name, tmp_path)
    assert eval_numbers(run, tmp_path / "eval") == expected[name]["eval"]


@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_exports_the_old_codes_weights(name, expected, tmp_path):
    run = _copy(name, tmp_path)
    assert export_numbers(run, tmp_path / "model") == expected[name]["export"]


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_resumes_exactly_one_more_step_equal_to_the_old_codes_straight_run(name, expected, request, tmp_path):
    """The fixtures are a 3-step run as its step-2 checkpoint left it; the old code's straight run
    logged the third row. The NFT resume joins the session's Ray cluster; DPO starts torchrun."""
    from typer.testing import CliRunner

    from cosmos_rl.checkpoint import read_dcp_metadata
    from cosmos_rl.cli import app

    if name.startswith("nft"):
        request.getfixturevalue("ray_cluster")
    run = _copy(name, tmp_path)
    result = CliRunner().invoke(app, ["resume", str(run), "--exact"])
    assert result.exit_code == 0, result.output[-3000:]
    # Floats to the house-parity tolerance: another kind of CPU rounds the training forward's
    # float32 sums differently (tests/test_house_parity.py, FLOAT_REL).
    from test_house_parity import FLOAT_ABS, FLOAT_REL

    got, want = rows(run), expected[name]["rows"]
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for g, w in zip(got, want):
        for key, value in w.items():
            if isinstance(value, float) and isinstance(g[key], float):
                assert abs(g[key] - value) <= max(FLOAT_REL * max(abs(value), abs(g[key])), FLOAT_ABS), (g["step"], key, value, g[key])
            else:
                assert g[key] == value, (g["step"], key)
    # The step it saved is in today's format: every adapter tensor keyed with its adapter's name.
    keys = read_dcp_metadata(run / "checkpoints" / "step_3").state_dict_metadata
    for component in ("policy", "old") if name.startswith("nft") else ("policy",):
        saved = [k for k in keys if k.startswith(f"{component}.")]
        assert saved and all(f".lora_A.{component}." in k or f".lora_B.{component}." in k for k in saved), saved[:3]


def _write_expected(out: Path) -> None:
    """Measure the fixtures with whichever cosmos_rl is importable (the old code, to make expected.json)."""
    import tempfile

    found = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in RUNS:
            work = Path(scratch) / name
            run = _copy(name, work)
            found[name] = {"eval": eval_numbers(run, work / "eval"), "export": export_numbers(run, work / "model")}
            done = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", "resume", str(run), "--exact"], cwd=work)
            assert done.returncode == 0, f"resume of {name} failed"
            found[name]["rows"] = rows(run)
    out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    _write_expected(Path(sys.argv[1]))
