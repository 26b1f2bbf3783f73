"""Progress of a long command (`eval`, `pairs mine`) on stderr, so `--json` keeps stdout to itself."""

from __future__ import annotations

import time

from rich.console import Console

err = Console(stderr=True, soft_wrap=True)

PROGRESS_EVERY_S = 30.0  # a long command's log gets a progress line at least this often, as training's does


class CommandProgress:
    """Progress of a long command (eval, pairs mine) on stderr, so `--json` keeps stdout to itself:
    a transient rich bar on a terminal; in a log (not a terminal) a plain line at the first and the
    last count of each phase and whenever PROGRESS_EVERY_S seconds passed, with the count, the time
    the phase took so far and its ETA. Call it as `progress(what, done, total)`."""

    def __init__(self, command: str, unit: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.command, self.unit = command, unit
        columns = (TextColumn(f"{command} {{task.description}}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeRemainingColumn())
        self._bar = Progress(*columns, console=err, transient=True, disable=not err.is_terminal)
        self._task = None
        self._what: str | None = None
        self._began = self._last = 0.0

    def __enter__(self) -> "CommandProgress":
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)

    def __call__(self, what: str, done: int, total: int) -> None:
        from cosmos_rl.commands.run_summary import clock

        now = time.monotonic()
        if what != self._what:  # a new phase (the checkpoint, then its base): its own count and clock
            self._what, self._began, self._last = what, now, now
            self._task = self._bar.add_task(what, total=total)
            first = True
        else:
            first = False
        self._bar.update(self._task, completed=done, total=total)
        if err.is_terminal or not (first or done >= total or now - self._last >= PROGRESS_EVERY_S):
            return
        self._last = now
        elapsed = now - self._began
        eta = clock(elapsed / done * (total - done)) if done else "?"
        label = f"{what}: " if what else ""
        err.print(f"{self.command}: {label}{done} of {total} {self.unit} ({clock(elapsed)} so far, eta {eta})", markup=False, highlight=False)
