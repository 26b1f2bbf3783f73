"""`cosmos-rl ARGS` run in this test process through typer's CliRunner, for tests whose subject is
a command's exit code, its words and the files it writes, not the process boundary: a fresh
`python -m cosmos_rl.cli` re-imports torch and diffusers (5-9 CPU s each on a 2-core runner)
before it does anything. Tests of process properties (signals, torchrun/Ray launches, the
`python -m` entry, environment inheritance, fresh-interpreter imports) keep their subprocess."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import traceback
from pathlib import Path


@dataclasses.dataclass
class Done:
    """The fields of `subprocess.CompletedProcess` the tests read, so a converted test keeps its assertions."""

    returncode: int
    stdout: str
    stderr: str


def cosmos(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None) -> Done:
    """Run `cosmos-rl *args` in-process from `cwd` with `env` added to os.environ (both restored after).

    An exception the command lets escape would be a traceback on a user's terminal: its traceback
    lands in `stderr` (and `returncode` is 1), so the tests' `"Traceback" not in stderr` still fails."""
    from typer.testing import CliRunner

    from cosmos_rl.cli import app

    saved = {key: os.environ.get(key) for key in env or {}}
    threads_before, ray_before = set(threading.enumerate()), _ray_initialized()
    try:
        os.environ.update(env or {})
        with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
            result = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    # A command run here shares the test process: what it starts must end with it, or it would
    # leak into every later test (a subprocess took its threads and its Ray job with it).
    left = [t.name for t in threading.enumerate() if t not in threads_before and not t.daemon and t.is_alive()]
    assert not left, f"cosmos-rl {' '.join(map(str, args))} left threads running in the test process: {left}"
    assert _ray_initialized() == ray_before, f"cosmos-rl {' '.join(map(str, args))} changed this process's Ray state"
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(result.exception))
    return Done(result.exit_code, result.stdout, stderr)


def _ray_initialized() -> bool:
    """Whether this process is connected to Ray (False without importing Ray when nothing did)."""
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def stop_self_when(ready, sig: int = 15, timeout_s: float = 600.0) -> threading.Thread:
    """A watcher that sends this process `sig` (SIGTERM by default) once `ready()` is true, as a
    scheduler signals a run: a command run here by `cosmos` (its stop handler installed in this
    process's main thread) finishes its step, commits and exits 75, as its subprocess would; the
    stop handler itself and the real process's exit are tests/test_group_signals.py's subject.

    It signals only while a run's stop handler (dist/preempt.StopFlag) holds `sig`: pytest's own
    default handler would end the test process. `join()` it after the command; `fired` says
    whether it signalled (a run that ended before `ready()` leaves it False)."""
    import signal
    import time

    from cosmos_rl.dist.preempt import StopFlag

    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not thread.done:
            if ready() and isinstance(getattr(signal.getsignal(sig), "__self__", None), StopFlag):
                thread.fired = True
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, name="stop_self_when", daemon=True)
    thread.fired, thread.done = False, False
    thread.start()
    return thread


def stop_watch(thread: threading.Thread) -> bool:
    """End a `stop_self_when` watcher (the command has returned); whether it signalled."""
    thread.done = True
    thread.join(timeout=5)
    return thread.fired


def straight_split_resumed(manifest, overrides: list[str], root: Path, steps: int) -> dict:
    """The exact-resume legs of one online manifest under `root`: a straight run of `steps`, a run
    stopped after step 1 ("split"), that run resumed with `--exact` to `steps`; {"root", "straight",
    "first", "rows_at_stop", "resumed"} (each leg's Done; the split run's rows when it stopped)."""
    import json

    done: dict = {"root": root}
    done["straight"] = cosmos("train", manifest, *overrides, f"rl.max_steps={steps}", 'job.name="straight"')
    done["first"] = cosmos("train", manifest, *overrides, "rl.max_steps=1", 'job.name="split"')
    lines = (root / "split" / "metrics.jsonl").read_text().splitlines()
    done["rows_at_stop"] = [json.loads(line) for line in lines if line.strip()]
    done["resumed"] = cosmos("resume", root / "split", "--exact", f"rl.max_steps={steps}")
    return done
