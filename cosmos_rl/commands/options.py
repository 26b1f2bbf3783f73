"""Parsers of the `cosmos-rl` command line's option values (cli.py calls them): each turns a
value a user typed into what the command takes, or refuses it in the usual one line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from cosmos_rl.core.errors import UserError


def finite_float(value) -> float:
    """The parser of every float option: `inf`, `-inf` and `nan` parse as floats but mean nothing to
    any option here (an infinite --guidance sampled garbage and wrote `Infinity` into eval.json)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise typer.BadParameter(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise typer.BadParameter(f"{value!r} is not a finite number; give a finite value")
    return number


def out_path(value: Optional[str], option: str = "--out") -> Optional[Path]:
    """An --out folder: an empty one would become Path("") == "." (the current folder, shown as '.')."""
    if value is None:
        return None
    if not value.strip():
        raise UserError(f"{option}: empty; pass the folder to write to (e.g. {option} out)")
    return checked_path(Path(value), option)


NAME_BYTES_MAX = 255  # the longest file name Linux file systems take (NAME_MAX)


def checked_path(path: Optional[Path], option: str) -> Optional[Path]:
    """A path option the file system can take: UTF-8 text, no NUL, no name longer than 255 bytes
    (an over-long one raised OSError(ENAMETOOLONG) as a traceback from the first stat)."""
    if path is None:
        return None
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{option} {ascii(text)}: not UTF-8 text; pass a path in UTF-8") from None
    if "\x00" in text:
        raise UserError(f"{option} {ascii(text)}: holds a NUL byte, which no path can; pass the path without it")
    for name in Path(text).parts:
        if len(name.encode("utf-8")) > NAME_BYTES_MAX:
            raise UserError(f"{option}: a name of {len(name.encode('utf-8'))} bytes ({name[:20]}...) is longer than the "
                            f"{NAME_BYTES_MAX} a file name can have; pass a shorter path")  # fmt: skip
    return path


def bind_host(host: str) -> str:
    """--host as the socket takes it: a bracketed IPv6 literal (`[::1]`, as URLs write it) without
    its brackets, so `[::1]` is the loopback it names rather than an unknown name taken for a
    public address; anything else as given."""
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


# The help of the options that pick a served reward, shared by `eval` and `pairs mine` (evaluation.served).
REWARD_URL_HELP = ("A reward service (`cosmos-rl reward serve`, or any with the same API) scoring the --reward names not given a "
                   "folder, e.g. http://127.0.0.1:8000; its revision is read once and pinned.")
REWARD_WEIGHT_HELP = "NAME=W, repeatable: a reward's weight in the weighted sum of several --reward (default 1)."
REWARD_TOKEN_ENV_HELP = "With --reward-url: the environment variable holding the service's bearer token (as rl.reward.token_env)."
