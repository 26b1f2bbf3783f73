"""How an evaluation samples: the run's sampler settings, or documented defaults. Torch-free.

A run whose algorithm samples while training (its registry entry's `sampler_fields`: NFT's
`rl.sample_steps`, `rl.sampler_shift` and `rl.guidance`) is evaluated with its own settings. A
DPO or SFT run (neither samples while training) and a bare model use NFT's defaults: 20 steps, guidance 3.0 and the
model's own scheduler shift (read from the schema, so they cannot drift from it). A run's
`rl.eval.sample_steps` / `rl.eval.guidance`, where set, replace the steps and the guidance. A shift left
unset is the model's own; `resolved` fills it in for reporting.
"""

from __future__ import annotations

import attrs

from cosmos_rl.config import algorithms
from cosmos_rl.core import schema
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
