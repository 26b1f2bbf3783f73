"""torchrun as the DPO launcher runs it: the same `torch.distributed.run`, minus its failure banner.

On any worker failure or stop signal torchrun prints a ChildFailedError / SignalException
traceback (about 50 lines) and its agent logs each failed rank at ERROR level, so one user mistake
reached the terminal three times. Here every worker records its one-line outcome in
`<run_dir>/logs/rank<N>.status` (`trainers/spmd_worker.py`), the launcher prints that line once, and
this entry only turns torchrun's exceptions into its exit code. Use:

    python -m cosmos_rl.dist.torchrun_quiet <torchrun arguments>
"""

from __future__ import annotations

import logging
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # The agent's per-rank ERROR records repeat what the workers' status files already say.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        torchrun.run(torchrun.parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as exc:
        codes = [failure.exitcode for failure in exc.failures.values()]
        return next((code for code in codes if code and code > 0), 1)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
