"""`nohup cosmos-rl train MANIFEST > log` as a person runs it on a cluster: the DPO smoke manifest cut
to 4 steps under real torchrun (2 ranks), stdout to a file and stderr with it, nothing on a
terminal. The log must show a progress line per step (never a rich bar, never cut at 80 columns)
and the closing summary; the identity `validate` printed is the one the checkpoint records; and a
resume with nothing left to do says so without launching torchrun."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from _overrides import DPO_SMALL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "dpo_t2i_smoke.toml"


def into_a_log(log: Path, *args: str, cwd: Path) -> int:
    """Run `cosmos-rl ARGS` as `nohup` does: stdin from /dev/null, stdout to `log`, stderr with it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}
    with log.open("w") as out:
        done = subprocess.run(["cosmos-rl", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, timeout=600)  # fmt: skip
    return done.returncode


def test_train_into_a_log_shows_progress_lines_and_a_closing_summary(tmp_path):
    overrides = [o for o in DPO_SMALL if not o.startswith("job.progress")] + [
        "rl.max_steps=4", f'job.output_dir="{tmp_path}"', 'job.name="logged"',
        "job.progress_every_s=5.0",  # a line at least every 5 s besides the one per step (job.log_every = 1)
    ]  # fmt: skip
    log = tmp_path / "log"
    code = into_a_log(log, "train", str(MANIFEST), *overrides, cwd=tmp_path)
    text = log.read_text()
    assert code == 0, text
    lines = text.splitlines()
    run = tmp_path / "logged"

    assert "step 0/4: training steps 1 to 4; a line every 1 step(s) or 5 s" in lines
    step_lines = [line for line in lines if re.match(r"step \d/4 \(\d+%\)  ", line)]
    assert [line.split()[1] for line in step_lines] == ["1/4", "2/4", "3/4", "4/4"]
    for line in step_lines:  # the step, the trainer's metrics, the rate and the ETA, on one whole line
        assert re.fullmatch(r"step \d/4 \(\d+%\)  train/loss \S+  train/dpo_accuracy \S+  \S+ pairs/s  elapsed \d+:\d\d:\d\d  eta \d+:\d\d:\d\d", line), line
    assert "━" not in text and "…" not in text  # no rich bar, nothing cut

    summary = lines[lines.index(next(line for line in lines if line.startswith("done: 4 of 4 steps in "))):]
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary[1].startswith("  final metrics (step 4): ") and f"train/loss {final['train/loss']:.4g}" in summary[1]
    assert summary[2:5] == [f"  run dir:     {run}", f"  metrics:     {run / 'metrics.jsonl'}", f"  checkpoint:  {run / 'checkpoints' / 'step_4'}"]
    assert any(line.startswith(f"    cosmos-rl eval {run}    #") for line in summary)
    assert any(line.startswith(f"    cosmos-rl resume {run} rl.max_steps=8    #") for line in summary)
    assert max(len(line) for line in summary) > 80  # long lines are kept whole

    # The identity validate printed is the one the checkpoint records.
    shown = subprocess.run(["cosmos-rl", "validate", str(MANIFEST), *overrides, "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    meta = json.loads((run / "checkpoints" / "step_4" / "meta.json").read_text())
    assert json.loads(shown.stdout)["summary"]["identity"] == meta["run_identity"]

    # Every step done: resume says so, prints the summary and launches nothing.
    again = tmp_path / "again.log"
    assert into_a_log(again, "resume", str(run), cwd=tmp_path) == 0
    resumed = again.read_text()
    assert f"nothing left to do: {run} has done all 4 steps" in resumed and "launch:" not in resumed
    assert "changed on resume" not in resumed
