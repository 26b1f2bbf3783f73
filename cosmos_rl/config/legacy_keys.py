"""Keys a release replaced, still read: a manifest or run directory that uses one loads as it did,
with one deprecation line (a run directory's saved manifest quietly: its user ran it as written).

- `rl.first_frame` (NFT: `none` | `image` | `shapes_world`) and `rl.first_frame_condition` (SFT: the
  share of clips trained image-to-video) became the `[model.condition]` table, which every
  algorithm and `eval` read (core/condition.py).

The run identity keeps the old spelling of what the old keys could say (`identity_spelling`), so
a run directory written before the change resumes, and a run's identity does not depend on which
spelling its manifest used.
"""

from __future__ import annotations

import copy
import json
import sys

# rl.first_frame's values -> (model.condition.kind, model.condition.source)
FIRST_FRAME = {"none": ("none", "none"), "image": ("first_frame", "image"), "shapes_world": ("first_frame", "shapes_video")}
_SOURCE_BACK = {source: value for value, (kind, source) in FIRST_FRAME.items() if kind != "none"}
_noted: set[str] = set()


def migrate(raw: dict) -> tuple[dict, list[str]]:
    """(`raw` with replaced keys moved to their new place, one deprecation line per key moved).
    A key whose new place the manifest also sets is left where it is, for preflight to name."""
    rl = raw.get("rl")
    if not isinstance(rl, dict) or not ({"first_frame", "first_frame_condition"} & set(rl)):
        return raw, []
    raw = copy.deepcopy(raw)
    rl, notes = raw["rl"], []
    model = raw.setdefault("model", {})
    if not isinstance(model, dict) or "condition" in model:
        return raw, []  # both spellings: the old key stays an unknown key, reported with the rest
    if "first_frame" in rl and rl.get("algorithm") == "nft":
        value = rl.pop("first_frame")
        kind, source = FIRST_FRAME.get(value, ("first_frame", value)) if isinstance(value, str) else ("first_frame", value)
        if kind != "none":
            model["condition"] = {"kind": kind, "source": source}
        new = f'kind = "{kind}", source = "{source}"' if kind != "none" else 'kind = "none" (the default: remove the key)'
        notes.append(f"rl.first_frame = {_toml(value)} is deprecated: write [model.condition] {new} (docs/video.md)")
    elif "first_frame_condition" in rl and rl.get("algorithm") == "sft":
        value = rl.pop("first_frame_condition")
        if value != 0:
            model["condition"] = {"kind": "first_frame", "source": "data", "probability": value}
        notes.append(f"rl.first_frame_condition = {_toml(value)} is deprecated: write [model.condition] kind = \"first_frame\", "
                     f'source = "data", probability = {_toml(value)} (docs/video.md)')
    return raw, notes


def _toml(value) -> str:
    return json.dumps(value) if isinstance(value, (str, int, float, bool)) else repr(value)


def note_once(lines: list[str]) -> None:
    """Print each deprecation line once per process (a command may load its manifest twice)."""
    for line in lines:
        if line not in _noted:
            _noted.add(line)
            print(f"note: {line}", file=sys.stderr)


def identity_spelling(flat: dict, algorithm: str) -> dict:
    """Flattened identity fields with a condition the old keys could say spelled as they said it
    (a first frame from an image or the moving-shapes world for NFT, from the clip for SFT)."""
    kind = flat.get("model.condition.kind", "none")
    source = flat.get("model.condition.source", "none")
    probability = flat.get("model.condition.probability", 1.0)
    if kind != "first_frame":
        return flat
    if algorithm == "nft" and source in _SOURCE_BACK and probability == 1.0:
        old = {"rl.first_frame": _SOURCE_BACK[source]}
    elif algorithm == "sft" and source == "data":
        old = {"rl.first_frame_condition": probability}
    else:
        return flat
    out = {k: v for k, v in flat.items() if not k.startswith("model.condition.")}
    return dict(sorted({**out, **old}.items()))
