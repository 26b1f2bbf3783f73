"""What DCP reads a step into: one template per component, checked against the step's index.

Built from the checkpoint's own metadata before anything is read, so a mismatch (a key the run
lacks or does not expect, a per-rank component saved by another world size, a component saved
under no known name) is reported for every component at once and nothing live is touched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_rl.checkpoint import layout
from cosmos_rl.checkpoint.dcp_io import flatten_keys
from cosmos_rl.checkpoint.state import PlainState, short_list


def _plain_prefix(name: str, state: PlainState, rank: int) -> str:
    return f"{name}.rank{rank}." if state.per_rank else f"{name}."


def build_templates(
    saved: dict[str, Any], meta: dict[str, Any], wrapped: dict[str, Stateful | PlainState], rank: int, world: int
) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """(problems, templates keyed by the name each component was saved under, component -> that
    name). ``saved`` is the step's DCP index (key -> storage metadata), ``meta`` its meta.json;
    a version-1 step's components are found under their legacy names (``layout.stored_name``)."""
    problems: list[str] = []
    recorded = meta.get("components", {})
    stored = {name: layout.stored_name(meta, name) for name in wrapped}
    templates: dict[str, Any] = {}
    for name, comp in wrapped.items():
        key = stored[name]
        if key not in recorded:
            problems.append(f"component {name!r} was not saved (has: {sorted(recorded)})")
            continue
        if isinstance(comp, PlainState):
            if comp.per_rank and meta["world_size"] != world:
                problems.append(
                    f"component {name!r} is per-rank and was saved by {meta['world_size']} "
                    f"ranks; this run has {world}"
                )
                continue
            prefix = _plain_prefix(key, comp, rank)
            flat = {}
            for dcp_key, md in saved.items():
                if dcp_key.startswith(prefix):
                    if not isinstance(md, dcp.TensorStorageMetadata):
                        problems.append(f"component {name!r}: {dcp_key} is not a tensor")
                        continue
                    flat[dcp_key[len(prefix):]] = torch.empty(md.size, dtype=md.properties.dtype)
            if "json" not in flat:
                problems.append(f"component {name!r}: no entries under {prefix}")
                continue
            templates[key] = {f"rank{rank}": flat} if comp.per_rank else flat
            continue
        have = {k for k in saved if k.startswith(f"{key}.")}
        # A component that reads more than one key layout (`policy.AdapterState`) says which
        # template fits the keys this step holds; any other reads into its state_dict().
        laid_out = getattr(comp, "template", None)
        template = laid_out({k[len(key) + 1:] for k in have}) if laid_out is not None else comp.state_dict()
        want = {f"{key}.{k}" for k in flatten_keys(template)}
        if want - have:
            problems.append(
                f"component {name!r}: keys missing from the checkpoint: " + short_list(sorted(want - have))
            )
        if have - want:
            problems.append(
                f"component {name!r}: checkpoint keys this run does not expect: " + short_list(sorted(have - want))
            )
        templates[key] = template
    return problems, templates, stored
