"""bench/gpu_check.py at tiny size on CPU, so the GPU script cannot rot between GPU slots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A subprocess that forms a (one-rank) gloo world.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"


def _run(*args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "tiny", "--device", "cpu", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)  # the whole of stdout is one JSON object


def test_tiny_cpu_run_reports_every_figure():
    out = _run("--iters", "1", "--repeats", "1")
    assert out["device"] == "cpu" and out["fsdp2"] is True and out["peak_bf16_tflops"] is None
    config = out["model_config"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vision_tokens_per_image"]) == (64, 2, 16)
    assert config["params_per_token"] == 90112  # worked by hand in tests/test_bench_mfu.py

    rollout = out["rollout"]
    assert rollout["samples"] == 4 and rollout["packed_s"] > 0 and rollout["pipeline_s"] > 0
    assert rollout["speedup"] == round(rollout["pipeline_s"] / rollout["packed_s"], 3)
    assert rollout["packed_mfu"] is None and rollout["transformer_flops"] > 0

    only, nft, dpo = out["nft_policy_only"], out["nft"], out["dpo"]
    assert (only["no_grad_forwards"], nft["no_grad_forwards"], dpo["no_grad_forwards"]) == (0, 2, 1)
    # Same batch: policy-only is one forward+backward (3 forwards), the full step adds old and reference (5).
    assert nft["flops"] * 3 == only["flops"] * 5
    for phase in (only, nft, dpo):
        assert phase["step_s"] > 0 and phase["mfu"] is None and phase["peak_memory_mib"] > 100

    assert out["memory"]["kind"] == "cpu_peak_rss" and out["memory"]["ratio"] is None
    assert out["memory"]["peak_mib"] >= nft["peak_memory_mib"]


def test_spent_budget_skips_phases_and_still_prints_json():
    out = _run("--budget-s", "0")
    for phase in ("nft_policy_only", "rollout", "nft", "dpo"):
        assert "time budget spent" in out[phase]["skipped"]
    assert out["memory"]["ratio"] is None
