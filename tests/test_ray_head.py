"""The local Ray head's clean-up rules (dist/ray_head.py), without starting Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import uuid

from cosmos_rl.dist import ray_head


def test_the_head_removes_only_run_files_in_the_system_temp_folder(tmp_path):
    """The driver names files on a pipe; a head must not become a way to delete anything else."""
    mine = os.path.join(tempfile.gettempdir(), f"{ray_head.RUN_FILE_PREFIX}{uuid.uuid4().hex}")
    deeper = tmp_path / f"{ray_head.RUN_FILE_PREFIX}x"  # the right name, one folder down
    other = os.path.join(tempfile.gettempdir(), f"not-cosmos-{uuid.uuid4().hex}")  # the right folder, another name
    for path in (mine, deeper, other):
        open(path, "w").close()
    try:
        for path in (mine, str(deeper), other, os.path.join(tempfile.gettempdir(), "..", "etc", "passwd")):
            ray_head._remove_run_file(path)
        assert not os.path.exists(mine)
        assert deeper.exists() and os.path.exists(other)
    finally:
        os.remove(other)


def test_the_session_sweep_finds_a_session_s_processes_and_kills_them():
    """A child that starts a grandchild in its own session: the sweep of that session finds and
    kills both (Ray's agents are such grandchildren), and nothing outside it."""
    code = textwrap.dedent(
        """
        import os, subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(grandchild.pid, flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        grandchild = int(child.stdout.readline())
        assert sorted(ray_head.session_pids(child.pid)) == sorted([child.pid, grandchild])
        ray_head.kill_session_leftovers(child.pid)
        assert child.wait(timeout=10) == -9
        assert ray_head.session_pids(child.pid) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
