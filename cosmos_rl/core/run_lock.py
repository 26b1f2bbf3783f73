"""One run per run directory: `train` and `resume` hold `<run_dir>/.lock` for their whole process tree.

The lock is an advisory `flock` on an open file, so the kernel drops it when the last process
holding the file closes it or dies: a lock left by a crashed run is simply taken (no stale-PID
guessing), and a SIGKILLed launcher's torchrun child, which inherits the open file, keeps the
directory locked until it has stopped too. The file records who took it (pid, host, command,
time) so a refused second run can say which process to wait for or stop.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from cosmos_rl.core.errors import UserError

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # run_dir -> fd, for the locks this process holds


def acquire(run_dir: Path, command: str) -> None:
    """Lock `run_dir` for this process (and the children it passes `inherited_fds()` to), or refuse."""
    run_dir = Path(run_dir).resolve()
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(path)
        os.close(fd)
        raise UserError(
            f"{run_dir} is in use by another cosmos-rl run ({holder}); two runs in one directory would "
            "interleave their metrics and checkpoints. Wait for it to finish or stop it, or choose another job.name"
        ) from None
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since_unix": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    _held[run_dir] = fd


def release(run_dir: Path) -> None:
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def inherited_fds() -> tuple[int, ...]:
    """The lock fds a child process should inherit so the lock covers it too (see the module docstring)."""
    return tuple(_held.values())


def _describe(path: Path) -> str:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record["since_unix"])))
        return f"pid {int(record['pid'])} on {record['host']!r}, `{record['command']}`, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def die_with_parent() -> None:
    """For a child's preexec_fn: SIGTERM it when the launching process dies (Linux), so a killed
    launcher never leaves a worker tree training on its own."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
