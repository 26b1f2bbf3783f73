"""The exceptions that decide a run's exit code, and the codes themselves (defined here only)."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUEUE = 0, 1, 2, 75


class UserError(Exception):
    """A problem the user caused and can fix; the CLI prints it without a traceback."""


class Preempted(Exception):
    """The run stopped on SIGTERM/SIGUSR1 after committing a checkpoint; the CLI exits 75 (requeue)."""


class RunFailed(Exception):
    """A run failed for a reason that is not a manifest mistake (a dead rank, a vanished reward service).

    The message is one line that says what happened and where the details are; the CLI exits 1.
    """


def exit_code_for(exc: BaseException) -> int:
    """The CLI's exit code for an exception that ended a run (or a rank of it)."""
    if isinstance(exc, Preempted):
        return EXIT_REQUEUE
    if isinstance(exc, UserError):
        return EXIT_USAGE
    return EXIT_FAILED
