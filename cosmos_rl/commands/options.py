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
    return Path(value)


def bind_host(host: str) -> str:
    """--host as the socket takes it: a bracketed IPv6 literal (`[::1]`, as URLs write it) without
    its brackets, so `[::1]` is the loopback it names rather than an unknown name taken for a
    public address; anything else as given."""
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host
