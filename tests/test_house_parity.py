"""The numbers the code computed before the one-house redesign (tests/fixtures/house_before/), kept.

The whole comparison (five runs, about 20 minutes) is `bench/house_parity.py`; the suite reruns the
two smoke runs at the smallest budget that still covers each launch path: DPO under torchrun to
its end (every row and its `cosmos-rl eval`), and the first 10 NFT steps on the Ray actor group
(every row up to step 10: nothing in a step depends on rl.max_steps, and with log_every 1 the last
step logs its KL either way).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "house_before"
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}

_spec = importlib.util.spec_from_file_location("house_parity", ROOT / "bench" / "house_parity.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)


def _cli(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_dpo_smoke_rows_and_eval_equal_the_fixture(tmp_path):
    _cli("train", str(ROOT / "manifests" / "dpo_t2i_smoke.toml"), f'job.output_dir="{tmp_path}"', cwd=tmp_path)
    run = tmp_path / "dpo_t2i_smoke"
    _cli("eval", str(run), "--json", "--device", "cpu", "--out", str(tmp_path / "eval"), cwd=tmp_path)
    after = tmp_path / "after" / "dpo_t2i_smoke"
    after.mkdir(parents=True)
    (after / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text())
    (after / "eval.json").write_text((tmp_path / "eval" / "eval.json").read_text())
    report = parity.compare(tmp_path / "after", FIXTURES)
    assert report["dpo_t2i_smoke"] == []


@pytest.mark.slow
def test_nft_smoke_first_steps_equal_the_fixture(tmp_path):
    _cli("train", str(ROOT / "manifests" / "nft_t2i_smoke.toml"), f'job.output_dir="{tmp_path}"', "rl.max_steps=10", cwd=tmp_path)
    rows = _rows(tmp_path / "nft_t2i_smoke" / "metrics.jsonl")
    before = [row for row in _rows(FIXTURES / "nft_t2i_smoke" / "metrics.jsonl") if row["step"] <= 10]
    assert [row["step"] for row in rows] == list(range(1, 11))
    diffs: list[str] = []
    for b, a in zip(before, rows):
        parity._diff_tree(b, a, f"step {b['step']}", diffs)
    assert diffs == []
