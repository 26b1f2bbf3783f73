"""What every `cosmos-rl` command prints with and how a user's error ends it: the two consoles, JSON
output, one-line warnings, the error-to-exit-code mapping and the --device check. `cli.py` and the
command groups (`reward_cli.py`, `pairs_cli.py`) share them."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape

from cosmos_rl.core.errors import EXIT_USAGE, UserError

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def print_json(value) -> None:
    """Print JSON output; allow_nan=False because `Infinity`/`NaN` are not JSON (every number the
    commands print is finite by their checks, so a non-finite one is a bug, not a user's mistake)."""
    print(json.dumps(value, indent=2, allow_nan=False))


# Every message below may hold outside text (paths, another rank's error, a library's message, with
# brackets such as gloo's "[/__w/pytorch/...]"): it is escaped or printed with markup=False, never
# parsed as rich markup.
def fail(exc: BaseException) -> None:
    from cosmos_rl.core.problems import ManifestError

    if isinstance(exc, ManifestError):
        err.print(f"[bold red]error[/]: {escape(exc.source or 'manifest')}: {len(exc.problems)} problem(s)", highlight=False)
        for problem in exc.problems:
            err.print(f"  {problem.render()}", highlight=False, markup=False)
    else:
        err.print("[bold red]error[/]: ", end="", highlight=False)
        err.print(str(exc), markup=False, highlight=False)
    raise typer.Exit(EXIT_USAGE)


def warn(line: str) -> None:
    """A warning line on stderr; `line` may hold outside text, so it is never parsed as markup."""
    err.print("[yellow]warning[/]: ", end="", highlight=False)
    err.print(line, markup=False, highlight=False)


def check_device(device: str) -> None:
    if device not in ("auto", "cpu", "cuda"):
        fail(UserError(f"--device: {device!r} is not one of auto, cpu, cuda"))
