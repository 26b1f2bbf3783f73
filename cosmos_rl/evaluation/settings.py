"""How an evaluation samples: the run's sampler settings, or documented defaults. Torch-free.

An NFT run is evaluated with its own `rl.sample_steps`, `rl.sampler_shift` and `rl.guidance`. A
DPO run (which never samples) and a bare model use NFT's defaults: 20 steps, shift 5.0,
guidance 3.0 (read from the schema, so they cannot drift from it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import attrs

from cosmos_rl.config import schema

DEFAULT_BATCH = 32  # samples per sampler call (guidance != 1 packs twice as many into each forward)


@dataclass(frozen=True)
class SamplerSettings:
    steps: int
    shift: float
    guidance: float

    def as_json(self) -> dict:
        return asdict(self)


def default_settings() -> SamplerSettings:
    fields = attrs.fields_dict(schema.NFTConfig)
    return SamplerSettings(
        steps=fields["sample_steps"].default, shift=fields["sampler_shift"].default, guidance=fields["guidance"].default
    )


def run_settings(config: schema.RunConfig) -> SamplerSettings:
    rl = config.rl
    if isinstance(rl, schema.NFTConfig):
        return SamplerSettings(steps=rl.sample_steps, shift=rl.sampler_shift, guidance=rl.guidance)
    return default_settings()
