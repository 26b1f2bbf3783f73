class UserError(Exception):
    """A problem the user caused and can fix; the CLI prints it without a traceback."""


class Preempted(Exception):
    """The run stopped on SIGTERM/SIGUSR1 after committing a checkpoint; the CLI exits 75 (requeue)."""


class RunFailed(Exception):
    """A run failed for a reason that is not a manifest mistake (a dead rank, a vanished reward service).

    The message is one line that says what happened and where the details are; the CLI exits 1.
    """
