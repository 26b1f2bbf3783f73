"""Stop cleanly when a scheduler asks: SIGTERM/SIGUSR1/SIGINT finish the step, commit, exit 75.

A scheduler sends SIGTERM (or SIGUSR1 with `--signal=USR1@90` on Slurm) some time before it kills a
job it will requeue; Ctrl-C in a terminal sends SIGINT to the whole foreground group, and is the
same request (so the first Ctrl-C of a run loses nothing, a second one aborts). The first signal only sets a flag; the training loop calls
``StopFlag.should_stop()`` at the end of every step, which agrees across ranks (any rank signalled
means every rank stops at the same step), and then commits a checkpoint and raises ``Preempted``.
A second signal before the stop's checkpoint is committed means "now": the process aborts at once
(exit 1), the checkpoint being written is never committed and the previous one stays. A second
signal after the commit changes nothing: the run still exits 75.
"""

from __future__ import annotations

import os
import signal
import sys

from cosmos_rl.core.errors import EXIT_FAILED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopFlag:
    def __init__(self) -> None:
        self.signalled: str | None = None
        self.committed = False  # the stop's checkpoint is committed: a second signal changes nothing
        self._previous: dict[int, object] = {}

    def install(self) -> "StopFlag":
        """Handle the stop signals; again after a library set its own handlers (Ray's `init` does),
        keeping the flag and the handlers to restore on `uninstall`."""
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._on_signal)
            self._previous.setdefault(sig, previous)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            if self.committed:
                sys.stderr.write(f"cosmos-rl: second {name}: the checkpoint is already committed; stopping as planned\n")
                sys.stderr.flush()
                return
            sys.stderr.write(f"cosmos-rl: second {name}: aborting; the checkpoint being written (if any) is dropped, "
                             "the previous committed one is kept\n")
            sys.stderr.flush()
            os._exit(EXIT_FAILED)
        self.signalled = name
        sys.stderr.write(f"cosmos-rl: {name} received: finishing this step, then committing a checkpoint (send again to abort)\n")
        sys.stderr.flush()

    def mark_committed(self) -> None:
        self.committed = True

    def install_if_main_thread(self) -> "StopFlag":
        """Install where signals can be handled; elsewhere (a test's worker thread) stay uninstalled."""
        try:
            return self.install()
        except ValueError:  # signal handlers can only be set from the main thread
            return self

    def should_stop(self) -> str | None:
        """The stop signal's name on every rank when any rank was signalled, else None (collective
        when a process group exists, so every rank stops after the same step)."""
        from cosmos_rl.dist.world import process_group_active

        if not process_group_active():
            return self.signalled
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.signalled else 0], dtype=torch.int32)
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not flag.item():
            return None
        return self.signalled or "a stop signal to another rank"
