"""The exceptions that decide a run's exit code, and the codes themselves (defined here only)."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_HACKING, EXIT_REQUEUE = 0, 1, 2, 3, 75


class UserError(Exception):
    """A problem the user caused and can fix; the CLI prints it without a traceback."""


class Preempted(Exception):
    """The run stopped on SIGTERM/SIGUSR1 after committing a checkpoint; the CLI exits 75 (requeue)."""


class RunFailed(Exception):
    """A run failed for a reason that is not a manifest mistake (a dead rank, a vanished reward service).

    The message is one line that says what happened and where the details are; the CLI exits 1.
    """


class HackingStopped(Exception):
    """The reward-hacking watch warned and `rl.eval.stop_on_hacking` asked to stop: the step's
    checkpoint is committed; the CLI exits 3 (look at the samples, then resume or discard)."""


class RewardUnavailable(RunFailed):
    """The reward service failed for good during a step, before that step trained anything: every
    rank has put its prompt cursor back, so the previous step's state can still be committed."""


def exit_code_for(exc: BaseException) -> int:
    """The CLI's exit code for an exception that ended a run (or a rank of it)."""
    if isinstance(exc, Preempted):
        return EXIT_REQUEUE
    if isinstance(exc, HackingStopped):
        return EXIT_HACKING
    if isinstance(exc, UserError):
        return EXIT_USAGE
    return EXIT_FAILED


def library_text(exc: BaseException, limit: int = 200) -> str:
    """A library's error message as one printable line for a UserError: terminal colour codes
    (torch puts ANSI bold into its unpickler errors) dropped, other control characters escaped,
    whitespace collapsed, at most `limit` characters; the exception's type when it says nothing."""
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]", "", str(exc))
    text = " ".join(text.split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text or type(exc).__name__
