"""Generate docs/manifest.md from the config tree's field documentation.

    python -m cosmos_rl.commands.docs_gen > docs/manifest.md

A test regenerates it and fails when the checked-in copy is stale.
"""

from __future__ import annotations

import typing

import attrs

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema

HEADER = """# Manifest reference

Generated from `cosmos_rl/core/schema.py` by `python -m cosmos_rl.commands.docs_gen`; do not edit by hand.
Every key is a dotted path usable in a manifest table or as a `KEY=VALUE` override (values are TOML:
`rl.max_steps=5`, `'job.name="x"'`: on a command line a string's TOML quotes go inside shell quotes).
Unknown keys and wrong types are errors.
`rl.algorithm` selects which `rl` table applies.
"""


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`".replace("'", '"') for a in typing.get_args(tp))
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in args)
        return f"{inner} (optional)" if len(args) < len(typing.get_args(tp)) else inner
    if origin is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _default(field: attrs.Attribute) -> str:
    if field.default is attrs.NOTHING:
        return "required"
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        value = field.default.factory()
        return "(table)" if attrs.has(type(value)) else f"`{value!r}`"
    return f"`{field.default!r}`"


def _rows(cls, prefix: str) -> list[tuple[str, str, str, str]]:
    rows, tables = [], []
    # `algorithm` first: attrs lists the shared RLBase fields before an algorithm's own.
    for field in sorted(attrs.fields(cls), key=lambda f: f.name != "algorithm"):
        path = f"{prefix}{field.name}"
        nested = [t for t in (typing.get_args(field.type) or (field.type,)) if attrs.has(t)]
        if nested:
            # `rl` is a tagged union: its variants get sections of their own.
            if not (cls is schema.RunConfig and field.name == "rl"):
                array = typing.get_origin(field.type) is list  # an array of tables: rl.rewards[].name
                tables.append((path + "[]" if array else path, nested[0], field.metadata["doc"]))
            continue
        rows.append((path, _type_name(field.type), _default(field), field.metadata["doc"]))
    out = rows
    for path, nested_cls, doc in tables:
        out.append((f"**{path}**", "table", "", doc))
        out.extend(_rows(nested_cls, path + "."))
    return out


def _table(rows) -> str:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def generate() -> str:
    parts = [HEADER]
    sections = [("Common tables", schema.RunConfig, "")]
    for name in algorithms.BUILT_IN:
        entry = algorithms.get(name)
        sections.append((f"`rl` for {entry.title} (`rl.algorithm = \"{name}\"`)", entry.config, "rl."))
    for title, cls, prefix in sections:
        parts.append(f"## {title}\n\n{_table(_rows(cls, prefix))}\n")
    profiles = "\n".join(f"- `{name}`: {p['description']} (image size {p['image_size']})" for name, p in schema.T2I_PROFILES.items())
    parts.append(f"## Known T2I profiles (`rl.profile`)\n\n{profiles}\n")
    identity = ", ".join(f"`{k}`" for k in sorted(schema.NON_IDENTITY_FIELDS))
    parts.append(
        "## Run identity\n\nEvery field except these is part of the run identity that "
        f"`resume --exact` protects: {identity}.\n"
    )
    return "\n".join(parts)


if __name__ == "__main__":
    print(generate(), end="")
