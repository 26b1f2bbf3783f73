"""A private local Ray head kept in a session of its own, which cleans up after the driver.

`ray.init()` without an address starts Ray's daemons (GCS, raylet, their agents and the workers)
as children of the driver, in the driver's process group. A stop signal sent to that group
(Ctrl-C in a terminal, `timeout`, a scheduler signalling the job's group) then kills the daemons
with the driver's first signal, before the driver has committed its checkpoint; and a SIGKILLed
driver leaves the agents (re-parented to PID 1) and the run's Ray temp folder behind.

So the driver starts this module instead (`python -m cosmos_rl.dist.ray_head TEMP_DIR`) with
`start_new_session=True`. It starts the head cluster, prints one JSON line (the GCS address and
node address), then waits on its stdin: the driver holds the other end of that pipe, so EOF comes
when the driver closes it or dies in any way, SIGKILL included. It then shuts the cluster down,
kills whatever is left in its session (Ray's agents and workers) and removes the temp folder and
the run files the driver named on the pipe (one path a line: the ranks' rendezvous file). The head ignores SIGINT/SIGTERM once started: it is not the process a stop is meant for.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

from cosmos_rl.dist.warm_workers import ACTOR_ENV
from cosmos_rl.core.errors import RunFailed

# Set before a local cluster starts: keep every Ray service on 127.0.0.1 (docs/topology.md, "Platform traps"), no token
# files in the home directory, and no hub traffic from the actors.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}

# How long the cluster's own shutdown may take before the session's leftovers are killed.
SHUTDOWN_GRACE_S = 10.0
# How long the head may take to start (a loaded 2-core machine: about 30 s) and to clean up.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
LOG_NAME = "head.log"
# The only files a head removes besides its own folder: the run's in the system temp folder
# (the ranks' rendezvous file, `dist.ray_group.store_file_for`).
RUN_FILE_PREFIX = "cosmos-rl-store-"


def local_ray_init_kwargs(temp_dir: str, num_cpus: float | None = None) -> dict:
    """ray.init arguments for a private single-host cluster (also used by the tests' fixture)."""
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    kwargs = dict(
        include_dashboard=False,
        _temp_dir=temp_dir,
        log_to_driver=True,
        configure_logging=False,
        runtime_env={"env_vars": dict(ACTOR_ENV)},
    )
    if num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    return kwargs


class Head:
    """The driver's side: start the head process, read its address, and stop it (which also
    removes `temp_dir`). The head also stops by itself once this process is gone."""

    def __init__(self, temp_dir: str, num_cpus: float | None = None, warm_env: dict | None = None, warm_count: int = 0):
        """`warm_count` > 0: the cluster's workers run with `warm_env` set and `warm_count` of them
        start importing the stack at once (dist/warm_workers.py); if they cannot be started, the head's
        log says why and the actors start cold."""
        self.temp_dir = temp_dir
        self.log_path = os.path.join(temp_dir, LOG_NAME)
        argv = [sys.executable, "-m", "cosmos_rl.dist.ray_head", temp_dir, "" if num_cpus is None else str(num_cpus)]
        env = None
        if warm_count > 0:
            argv.append(str(warm_count))
            env = {**os.environ, **(warm_env or {})}  # Ray's daemons pass their environment on to the workers
        with open(self.log_path, "wb") as log:
            # close_fds (the default): the head holds no copy of the run directory's lock.
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True, env=env
            )
        self.info = self._read_answer()

    def _read_answer(self) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S
        out = self.process.stdout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out], [], [], 0.2)
            if ready:
                line = out.readline()
                if line:
                    return json.loads(line)
                break  # EOF: the head exited before answering
            if self.process.poll() is not None:
                break
        said = self._last_log_line()  # before stop() removes the folder holding the log
        self.stop()
        raise RunFailed(f"the local Ray cluster did not start: {said}")

    def _last_log_line(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
        except OSError:
            lines = []
        return (lines[-1][:400] if lines else "no output").encode("unicode_escape").decode("ascii")

    def remove_on_exit(self, path: str) -> None:
        """Have the head remove `path` (a run file in the temp folder) when it cleans up, also after a SIGKILL of this process."""
        try:
            self.process.stdin.write(os.fsencode(path) + b"\n")
            self.process.stdin.flush()
        except (OSError, ValueError):  # the head is gone already: the driver's own cleanup still runs
            pass

    def stop(self) -> None:
        """Close the head's stdin (its signal to shut down) and wait; kill it as a last resort."""
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the head and what it started
            except OSError:
                pass
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def session_pids(sid: int) -> list[int]:
    """Every live (not zombie) process of session `sid` but this one (Linux /proc; empty elsewhere)."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.getsid(int(entry)) == sid and not _zombie(entry):
                pids.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to ask about
            continue
    return pids


def _zombie(pid: str) -> bool:
    """Dead already, waiting for its parent to reap it (nothing left to kill)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"


def kill_session_leftovers(sid: int) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    temp_dir = argv[0]
    num_cpus = float(argv[1]) if len(argv) > 1 and argv[1] else None
    warm_count = int(argv[2]) if len(argv) > 2 else 0
    import ray

    from cosmos_rl.dist import warm_workers

    kwargs = local_ray_init_kwargs(temp_dir, num_cpus)
    kwargs.pop("runtime_env", None)  # the driver's job (or, warm, this process's environment) sets the actors'
    kwargs["log_to_driver"] = False
    if warm_count:
        kwargs["_system_config"] = warm_workers.system_config(warm_count)
    context = ray.init(**kwargs)
    answer = {"gcs_address": context.address_info["gcs_address"], "node_ip": ray.util.get_node_ip_address()}
    if warm_count:  # asked first: the workers import while the driver joins and places its group
        ports = [n["NodeManagerPort"] for n in ray.nodes() if n["NodeID"] == context.address_info["node_id"]]
        why_not = warm_workers.prestart(ports[0], warm_count) if ports else "no node manager port"
        if why_not:
            print(f"warm workers not started ({why_not}): the actors start cold", file=sys.stderr, flush=True)
    # Ignored only now: Ray's daemons were started with the default dispositions, so the driver's
    # shutdown (and ray.shutdown below) can still stop them with SIGTERM.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    leftovers = []
    try:
        for line in sys.stdin.buffer:  # EOF: the driver closed the pipe or is gone
            leftovers.append(os.fsdecode(line.rstrip(b"\n")))
    finally:
        try:
            ray.shutdown()
        finally:
            if os.getsid(0) == os.getpid():  # only a session of our own: never the caller's
                kill_session_leftovers(os.getpid())
            shutil.rmtree(temp_dir, ignore_errors=True)
            for path in leftovers:
                _remove_run_file(path)
    return 0


def _remove_run_file(path: str) -> None:
    """A file the driver asked to have removed: only the run's own files in the temp folder."""
    import tempfile

    if os.path.dirname(path) != tempfile.gettempdir() or not os.path.basename(path).startswith(RUN_FILE_PREFIX):
        return
    try:
        os.remove(path)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
