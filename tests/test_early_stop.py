"""A stop signal while a DPO run is still starting (before any worker reached a step) exits 75,
and `resume` on that run directory, which has no committed checkpoint, trains it from step 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _inproc import cosmos
from _overrides import DPO_SMALL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "dpo_t2i_smoke.toml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def test_sigterm_while_starting_exits_75_and_resume_starts_from_step_0(tmp_path):
    args = [*DPO_SMALL, "rl.max_steps=2", "rl.validation.every=0", f'job.output_dir="{tmp_path}"']
    proc = subprocess.Popen([sys.executable, "-m", "cosmos_rl.cli", "train", str(MANIFEST), *args],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "dpo_t2i_smoke"
    deadline = time.time() + 60
    while not (run_dir / "manifest.toml").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # torchrun is starting its workers: no step has run
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert "before the workers reached their first step; nothing was lost" in err
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").glob("step_*/COMMITTED"))

    # The resume is the real CLI in this process (tests/_inproc.py): its exit code, its words and the
    # run it trains are the subject; it still launches its torchrun ranks as processes.
    resumed = cosmos("resume", run_dir, env={"HF_HUB_OFFLINE": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "starting from step 0" in resumed.stderr
    assert (run_dir / "checkpoints" / "step_2" / "COMMITTED").is_file()


def test_a_user_error_in_a_worker_is_one_line_once_with_exit_2(tmp_path):
    """A decompression bomb in the pairs, met by both ranks in their first step (so only at run
    time): torchrun's ChildFailedError banner and the ranks' own copies stay out of the terminal;
    the launcher says it once, with exit 2."""
    import json

    from _image_helpers import bomb_png, png_bytes

    for name, data in (("w.png", png_bytes((200, 0, 0), 32)), ("l.png", png_bytes((0, 0, 200), 32)), ("huge.png", bomb_png())):
        (tmp_path / name).write_bytes(data)
    rows = [{"id": f"p{i}", "prompt": "a red square", "winner": "huge.png", "loser": "l.png"} for i in range(4)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["rl.data.synthetic_pairs=0", f'rl.data.jsonl="{tmp_path / "pairs.jsonl"}"', "rl.pairs_per_step=2",
            "rl.validation.every=0", "job.progress=false", f'job.output_dir="{tmp_path}"']
    result = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", "train", str(MANIFEST), *args],
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert out.count("cannot decode image: too large to decode safely") == 1, out
    for noise in ("Traceback", "ChildFailedError", "SignalException", "*****"):
        assert noise not in out, out
