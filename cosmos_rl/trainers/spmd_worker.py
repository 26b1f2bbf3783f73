"""torchrun entry of a DPO or SFT run: `python -m cosmos_rl.trainers.spmd_worker <run_dir>/manifest.toml [--resume]`.

One process per rank. It joins the process group, runs `trainers.dpo` (or `trainers.sft`), and leaves through
`dist.world.finish_worker` (never interpreter teardown: see docs/topology.md, "Platform traps"). Exit codes follow the
CLI: 0 done, 2 a user mistake (UserError), 75 preempted after a committed checkpoint, 1 anything
else. The one-line reason goes to stderr and to `<run_dir>/logs/rank<N>.status` (JSON: code,
message), which the launcher reads because torchrun itself reports every worker failure as 1; the
traceback goes to `<run_dir>/logs/rank<N>.log`.
"""

from __future__ import annotations

import argparse
import json
import os
import logging
import sys
import traceback
from pathlib import Path

from cosmos_rl.core.errors import EXIT_FAILED, EXIT_HACKING, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE

# Set by the launcher (trainers/spmd_launch.py), which prints every outcome itself.
QUIET_WORKERS_ENV = "COSMOS_RL_QUIET_WORKERS"


def status_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.status"


def _setup_logging(run_dir: Path, rank: int) -> Path:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"rank{rank}.log"
    handler = logging.FileHandler(log_file, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return log_file


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_worker(manifest: Path, resume: bool) -> int:
    from cosmos_rl.dist.fsdp import quiet_view_output_warning
    from cosmos_rl.dist.torchrun import torchrun_rank

    run_dir = manifest.resolve().parent
    try:
        me = torchrun_rank()
    except Exception as exc:  # not under torchrun: nothing to log into per rank
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    log_file = _setup_logging(run_dir, me.rank)
    quiet_view_output_warning()
    status = status_path(run_dir, me.rank)
    status.unlink(missing_ok=True)
    code, message = EXIT_OK, ""
    try:
        from cosmos_rl.config import algorithms, load
        from cosmos_rl.dist.world import init_process_group, pick_device

        config = load.load(manifest, saved_run=True)
        trainer = algorithms.of(config).resolve("trainer")  # DPO's, SFT's: any "ranks" algorithm's
        device = pick_device(config.grid.device, me.local_rank)
        init_process_group(device, me.rank, me.world_size, config.grid.timeout_s)
        trainer(config, run_dir, device, resume=resume).run()
    except BaseException as exc:  # noqa: BLE001 - every failure must become an exit code and a line
        from cosmos_rl.core.errors import HackingStopped, Preempted, UserError

        logging.getLogger(__name__).error("rank %d failed:\n%s", me.rank, traceback.format_exc())
        if isinstance(exc, Preempted):
            code, message = EXIT_REQUEUE, str(exc)
        elif isinstance(exc, HackingStopped):
            code, message = EXIT_HACKING, str(exc)
        elif isinstance(exc, UserError):
            code, message = EXIT_USAGE, str(exc)
        else:
            code, message = EXIT_FAILED, f"rank {me.rank}: {_one_line(exc)} (traceback in {log_file})"
        if not os.environ.get(QUIET_WORKERS_ENV):  # run by hand: say it here; the launcher says it once
            print(f"error: {message}" if code != EXIT_REQUEUE else message, file=sys.stderr)
    status.write_text(json.dumps({"code": code, "message": message}), encoding="utf-8")
    return code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cosmos_rl.trainers.spmd_worker")
    parser.add_argument("manifest", type=Path, help="<run_dir>/manifest.toml written by `cosmos-rl train`")
    parser.add_argument("--resume", action="store_true", help="continue from the newest committed checkpoint")
    args = parser.parse_args(argv)
    code = run_worker(args.manifest, args.resume)
    from cosmos_rl.dist.world import finish_worker

    finish_worker(code)


if __name__ == "__main__":
    main()
