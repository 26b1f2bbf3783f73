"""Preflight rules of a preference-data section (`rl.data`, `rl.validation.data`), for any
algorithm that reads preference pairs (DPO's rules, `dpo.py`, call them). Torch-free like every
preflight module (a data factory is resolved by import, the one import a manifest can cause).
"""

from __future__ import annotations

from cosmos_rl.config.preflight.rules import Rules, seed_rule
from cosmos_rl.core import schema
from cosmos_rl.data.factory_spec import FactorySpecError, exposes_membership, resolve_factory


def sources(data: schema.PreferenceDataConfig) -> list[str]:
    """The sources a data section names, in the order the rules list them."""
    used = []
    if data.synthetic_pairs:
        used.append("synthetic_pairs")
    if data.jsonl:
        used.append("jsonl")
    if data.shards:
        used.append("shards")
    if data.factory:
        used.append("factory")
    return used


def data_source_rules(prefix: str, data: schema.PreferenceDataConfig, r: Rules, *, needs_membership: bool) -> None:
    """One data section (`prefix` is its key): at most one source, and the one named exists."""
    r.at_least(f"{prefix}.synthetic_pairs", data.synthetic_pairs, 0)
    seed_rule(f"{prefix}.synthetic_seed", data.synthetic_seed, r)
    used = sources(data)
    files = [s for s in used if s != "synthetic_pairs"]
    if data.synthetic_pairs and files:
        r.warn(f"{prefix}.synthetic_pairs", f"non-zero, so {', '.join(prefix + '.' + f for f in files)} is ignored", data.synthetic_pairs, "set it to 0 to train on the file source")
    elif len(files) > 1:
        r.error(prefix, "more than one data source", files, "keep exactly one of jsonl, shards, factory (or synthetic_pairs)")
    if data.synthetic_pairs:
        return
    if data.jsonl:
        r.local_path(f"{prefix}.jsonl", data.jsonl, kind="file")
    for i, shard in enumerate(data.shards):
        r.shard_files(f"{prefix}.shards[{i}]", shard)
    if data.factory:
        _factory(f"{prefix}.factory", data.factory, r, needs_membership=needs_membership)


def _factory(path: str, spec: str, r: Rules, *, needs_membership: bool) -> None:
    try:
        factory = resolve_factory(spec, path)  # imports the user's module: the one import a manifest can cause
    except FactorySpecError as exc:
        if exc.kind == "format":
            r.error(path, "must be module:function", spec, "e.g. my_data.pairs:make_source")
        elif exc.kind in ("not_found", "import_failed"):
            cause = exc.cause if exc.cause is not None else exc
            r.error(path, f"cannot import module {exc.module!r}: {type(cause).__name__}: {cause}", spec, "make it importable (PYTHONPATH)")
        else:
            r.error(path, f"module {exc.module!r} has no function {exc.attr!r}", spec, "name a callable that returns a pair source")
        return
    if needs_membership and not exposes_membership(factory):
        r.error(path, "used with validation, so it must expose a metadata-only membership_ids()", spec,
                "give the returned source (or the factory) a membership_ids() method; see docs/data.md")
