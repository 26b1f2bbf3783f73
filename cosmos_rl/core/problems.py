"""How manifest problems are carried and printed: `path: problem (got X); fix`."""

from __future__ import annotations

import math

import attrs

from cosmos_rl.core.errors import UserError

_NOTHING = object()


@attrs.frozen
class Problem:
    path: str
    problem: str
    got: object = _NOTHING
    fix: str = ""
    severity: str = "error"  # "error" stops the run; "warning" is printed and the run goes on

    def render(self) -> str:
        text = f"{self.path}: {self.problem}"
        if self.got is not _NOTHING:
            text += f" (got {show(self.got)})"
        if self.fix:
            text += f"; {self.fix}"
        return text

    def as_json(self) -> dict:
        out = {"path": self.path, "problem": self.problem, "fix": self.fix, "severity": self.severity}
        if self.got is not _NOTHING:
            out["got"] = _json_value(self.got)
        return out


def _json_value(value: object) -> object:
    """A user value as JSON can hold it: JSON has no inf or nan (json.dumps would write the non-JSON
    `Infinity`), so those become the string TOML writes (`inf`, `nan`); anything else not JSON, its repr."""
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (str, int, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return repr(value)


def show(value: object) -> str:
    """TOML-ish rendering of a user value, so the message shows what they typed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a table"
    return repr(value)


class ManifestError(UserError):
    """One or more problems in a manifest or its overrides; all are reported together."""

    def __init__(self, problems: list[Problem], source: str = ""):
        self.problems = [p for p in problems if p.severity == "error"]
        self.warnings = [p for p in problems if p.severity != "error"]
        self.source = source
        head = f"{source}: " if source else ""
        lines = [f"{head}{len(self.problems)} problem(s)"] + [f"  {p.render()}" for p in self.problems]
        super().__init__("\n".join(lines))
