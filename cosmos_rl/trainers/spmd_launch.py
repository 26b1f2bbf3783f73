"""Start a run under torchrun (DPO, SFT: any algorithm of launcher kind "ranks"): `start(config, run_dir, resume, console) -> exit code`.

`grid.backend = "local"`: run `plan.torchrun_argv` (plus `--resume` on resume) as a child
process, print the command first, forward SIGTERM/SIGINT/SIGUSR1 to it (as SIGTERM), and turn the workers'
status files into the CLI's exit semantics (torchrun reports any worker failure as 1, so the
reason and code each rank wrote to `<run_dir>/logs/rank<N>.status` decide: a UserError -> exit 2,
preemption -> 75, anything else -> 1).

Single node: torchrun `--standalone` on 127.0.0.1; each worker pins gloo to loopback because its
rendezvous address is loopback (the one rule, `dist.world.loopback_gloo`).
Multi-node (grid.nodes > 1): the operator runs `cosmos-rl train MANIFEST` (or `resume`) once on
every node with the same manifest; each node's torchrun starts its grid.gpus_per_node ranks and
they meet at the c10d rendezvous `grid.rdzv_endpoint` (or $COSMOS_RL_RDZV_ENDPOINT), job id
`job.name`. The run directory must be on a filesystem every node shares (checkpoints are
collective DCP writes).

`grid.backend = "ray"` runs the same rank trainers from a Ray driver instead (`trainers/ray_driver.py`).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

from rich.markup import escape

from cosmos_rl.planning import plan
from cosmos_rl.core import schema
from cosmos_rl.core.errors import EXIT_FAILED, EXIT_HACKING, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE, HackingStopped, Preempted, RunFailed, UserError
from cosmos_rl.trainers.spmd_worker import QUIET_WORKERS_ENV

# Every stop signal reaches torchrun as SIGTERM. SIGUSR1 (a scheduler's "about to preempt"): torchrun
# forwards only the signals it handles, and its default action on SIGUSR1 would kill it and orphan
# the workers. SIGINT (Ctrl-C, or a scheduler signalling the group): the workers' flag takes it too,
# but torchrun's own SIGINT handling is the less trodden path; one signal for every stop keeps the
# ranks on the one tested path (docs/requeue.md).
_FORWARD = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGTERM, signal.SIGUSR1: signal.SIGTERM}


def worker_argv(config: schema.RunConfig, run_dir: Path, *, resume: bool) -> list[str]:
    # preflight has checked that multi-node runs have an endpoint (manifest or environment)
    argv = plan.torchrun_argv(config, str(Path(run_dir) / "manifest.toml"))
    # The same torchrun, without its failure banner: the workers' status lines say it once.
    assert argv[1:3] == ["-m", "torch.distributed.run"], argv
    argv[2] = "cosmos_rl.dist.torchrun_quiet"
    if resume:
        argv.append("--resume")
    return argv


def worker_env(config: schema.RunConfig) -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env[QUIET_WORKERS_ENV] = "1"  # the launcher prints each outcome once; the workers stay quiet
    # torchrun pins one thread per worker only when a node runs several (and prints a banner saying
    # so); with one rank per node a CPU rank would use every core and sum in another order, so the
    # same run split as 2 nodes x 1 would not reproduce 1 node x 2. One thread per rank is torchrun's
    # own default on GPUs too; an operator's OMP_NUM_THREADS wins.
    env.setdefault("OMP_NUM_THREADS", "1")
    # torchrun SIGKILLs its workers this long after a stop signal (30 s by default), which would cut
    # a real model's last step and checkpoint short; give them as long as any collective may take.
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(int(config.grid.timeout_s)))
    return env


def _statuses(run_dir: Path) -> list[dict]:
    """The ranks' recorded outcomes, first written first: a rank that failed first is the root cause
    (the others then fail on the broken collective)."""
    out = []
    for path in sorted((Path(run_dir) / "logs").glob("rank*.status"), key=lambda p: (p.stat().st_mtime_ns, p.name)):
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return out


def _raise_for(run_dir: Path, returncode: int, stopped_by: str | None = None, config_world: int = 0) -> None:
    """Map the ranks' recorded outcomes (or torchrun's code) to the CLI's exceptions; return
    normally only when all `config_world` ranks reported success.

    `stopped_by`: the stop signal this launcher forwarded, if any. When no rank reported anything,
    the workers ended before their step loop (which reports every outcome), so nothing was trained
    since the last committed checkpoint: that is a requeue (75), not a failure.
    """
    statuses = _statuses(run_dir)
    if statuses and len(statuses) == config_world and all(s.get("code") == EXIT_OK for s in statuses):
        return  # every rank finished: a stop signal during the last step changes nothing (torchrun still says 143)
    if not statuses and stopped_by:
        raise Preempted(
            f"stopped by {stopped_by} before the workers reached their first step; nothing was lost: "
            f"continue with `cosmos-rl resume {run_dir}`"
        )
    by_code: dict = {}
    for s in statuses:
        by_code.setdefault(s.get("code"), s.get("message", ""))  # keep the first failure of each kind
    if EXIT_USAGE in by_code:
        raise UserError(by_code[EXIT_USAGE])
    if EXIT_REQUEUE in by_code:
        raise Preempted(by_code[EXIT_REQUEUE])
    if EXIT_HACKING in by_code:
        raise HackingStopped(by_code[EXIT_HACKING])
    if EXIT_FAILED in by_code:
        raise RunFailed(by_code[EXIT_FAILED])
    raise RunFailed(
        f"torchrun exited with code {returncode} before the workers reported why; see {Path(run_dir) / 'logs'} and the output above"
    )


def _run_forwarding_signals(argv: list[str], env: dict[str, str], forwarded: list[str]) -> int:
    """Run torchrun to its end; the name of each stop signal passed on is appended to `forwarded`."""
    # torchrun gets its own session: a signal sent to this process group (Ctrl-C in a terminal, a
    # scheduler signalling the job's group) then reaches the workers once, through the forwarding
    # below, instead of twice (which the workers would take as "abort now").
    # It inherits the run directory's lock (the lock then lasts until torchrun is gone too) and gets
    # SIGTERM if this launcher dies, so a killed launcher never leaves its workers training alone.
    from cosmos_rl.core import run_lock

    child = subprocess.Popen(
        argv, env=env, start_new_session=True, pass_fds=run_lock.inherited_fds(), preexec_fn=run_lock.die_with_parent
    )

    def forward(signum, frame):
        if child.poll() is None:
            forwarded.append(signal.Signals(signum).name)
            child.send_signal(_FORWARD[signum])

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARD}
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # only if a caller restored the default SIGINT handler
                forward(signal.SIGINT, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start(config: schema.RunConfig, run_dir: Path, resume: bool, console) -> int:
    run_dir = Path(run_dir)
    for stale in (run_dir / "logs").glob("rank*.status"):
        stale.unlink(missing_ok=True)
    argv = worker_argv(config, run_dir, resume=resume)
    console.print(f"[bold]launch[/]: {escape(shlex.join(argv))}", highlight=False, soft_wrap=True)
    forwarded: list[str] = []
    returncode = _run_forwarding_signals(argv, worker_env(config), forwarded)
    if returncode == 0:
        return 0
    world, _ = plan.world_size(config)
    _raise_for(run_dir, returncode, forwarded[0] if forwarded else None, world)
    return 0  # _raise_for raises unless every rank reported success
