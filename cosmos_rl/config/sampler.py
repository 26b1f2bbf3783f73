"""How an evaluation samples: the run's sampler settings, or documented defaults. Torch-free.

A run whose algorithm samples while training (its registry entry's `sampler_fields`: NFT's
`rl.sample_steps`, `rl.sampler_shift` and `rl.guidance`) is evaluated with its own settings. A
DPO or SFT run (neither samples while training) and a bare model use NFT's defaults: 20 steps, guidance 3.0 and the
model's own scheduler shift (read from the schema, so they cannot drift from it). A run's
`rl.eval.sample_steps` / `rl.eval.guidance`, where set, replace the steps and the guidance. A shift left
unset is the model's own; `resolved` fills it in for reporting.

A model folder `cosmos-rl export` wrote records the sampler its run was evaluated with
(`cosmos_rl.json`: `exported_from.sampler`); it is evaluated with those steps and that guidance, so
`eval FOLDER` scores what `eval RUN_DIR` scored (its scheduler already holds the run's shift).
"""

from __future__ import annotations

import math
from pathlib import Path

import attrs

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import MAX_METADATA_BYTES, read_user_json
from cosmos_rl.models.layout import MODEL_INFO
from cosmos_rl.models.sampler_settings import SamplerSettings

DEFAULT_BATCH = 32  # samples per sampler call (guidance != 1 packs twice as many into each forward)


def default_settings() -> SamplerSettings:
    fields = attrs.fields_dict(schema.NFTConfig)
    return SamplerSettings(
        steps=fields["sample_steps"].default, shift=fields["sampler_shift"].default, guidance=fields["guidance"].default
    )


def run_settings(config: schema.RunConfig) -> SamplerSettings:
    """How a run is evaluated: its [rl.eval] sample_steps / guidance where set, else its algorithm's
    own rollout settings (NFT's), else the defaults."""
    rl = config.rl
    fields = algorithms.of(config).sampler_fields
    if fields is not None:
        steps, shift, guidance = (getattr(rl, name) for name in fields)
        own = SamplerSettings(steps=steps, shift=shift, guidance=guidance)
    else:
        own = default_settings()
    e = rl.eval
    return SamplerSettings(
        steps=e.sample_steps or own.steps, shift=own.shift, guidance=own.guidance if e.guidance is None else e.guidance
    )


def folder_settings(folder: Path) -> SamplerSettings:
    """How a model folder is evaluated: the steps and guidance its `cosmos_rl.json` records when
    `cosmos-rl export` wrote it (the exporting run's own), else the defaults; the shift is the
    folder's scheduler's. A recorded sampler that is not one is refused, naming the file."""
    info_path = Path(folder) / MODEL_INFO
    if not info_path.is_file():
        return default_settings()
    # A FIFO or device is refused, not read; a damaged file is one line naming it and the fix.
    info = read_user_json(info_path, "", MODEL_INFO, MAX_METADATA_BYTES)
    exported = info.get("exported_from") if isinstance(info, dict) else None
    if exported is None:
        return default_settings()  # a folder save_parts wrote: no run, no sampler of its own
    sampler = exported.get("sampler") if isinstance(exported, dict) else None
    steps = sampler.get("steps") if isinstance(sampler, dict) else None
    guidance = sampler.get("guidance") if isinstance(sampler, dict) else None
    is_number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 and is_number(guidance)
            and math.isfinite(guidance) and guidance >= 0):  # fmt: skip
        raise UserError(
            f"{info_path}: exported_from.sampler must hold steps (an integer >= 1) and guidance (a number >= 0) "
            f"(got {sampler!r}); export the model again, or pass --sample-steps and --guidance"
        )
    return SamplerSettings(steps=steps, shift=None, guidance=float(guidance))
