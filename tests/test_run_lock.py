"""One run per run directory: a second train/resume is refused naming the holder; a dead holder's lock is taken."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _inproc import cosmos

from cosmos_rl.core import run_lock
from cosmos_rl.core.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding the lock, as a running `cosmos-rl train` would."""
    code = (
        "import sys, time\n"
        "from cosmos_rl.core import run_lock\n"
        f"run_lock.acquire({str(run_dir)!r}, 'cosmos-rl train other.toml')\n"
        "print('HELD', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "HELD"
    return proc


def test_a_second_run_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(UserError, match=rf"in use by another cosmos-rl run \(pid {holder.pid} on .*`cosmos-rl train other.toml`"):
            run_lock.acquire(tmp_path, "cosmos-rl resume x")
    finally:
        holder.kill()
        holder.wait()
    # The holder died without cleaning up: its record is still in the file, its lock is gone.
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["pid"] == holder.pid
    run_lock.acquire(tmp_path, "cosmos-rl resume x")
    try:
        assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["command"] == "cosmos-rl resume x"
    finally:
        run_lock.release(tmp_path)


def test_resume_of_a_locked_run_exits_2_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.toml").write_text((ROOT / "manifests" / "dpo_t2i_smoke.toml").read_text())
    holder = _holder(run_dir)
    try:
        # In-process (tests/_inproc.py): the lock is another process's (the holder), the refusal is the subject.
        result = cosmos("resume", run_dir)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2, result.stderr
    assert f"pid {holder.pid}" in result.stderr and "Traceback" not in result.stderr


def test_a_child_started_with_die_with_parent_stops_when_its_parent_is_killed(tmp_path):
    """What a torchrun child gets: SIGTERM once the launcher is gone (Linux)."""
    marker = tmp_path / "child.pid"
    child = tmp_path / "child.py"
    child.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    parent = (
        "import subprocess, sys, time\n"
        "from cosmos_rl.core import run_lock\n"
        f"subprocess.Popen([sys.executable, {str(child)!r}], preexec_fn=run_lock.die_with_parent)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.time() + 20
    while not (marker.exists() and marker.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    child_pid = int(marker.read_text())
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while Path(f"/proc/{child_pid}").exists() and time.time() < deadline:
        state = Path(f"/proc/{child_pid}/stat").read_text().split()[2] if Path(f"/proc/{child_pid}/stat").exists() else "X"
        if state == "Z":
            break
        time.sleep(0.05)
    gone = not Path(f"/proc/{child_pid}").exists() or Path(f"/proc/{child_pid}/stat").read_text().split()[2] == "Z"
    assert gone, "the child outlived its killed parent"
