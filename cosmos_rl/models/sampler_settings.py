"""How a sampler call runs: steps, flow shift, guidance. A plain value, torch-free (the config
layer builds it from a run, `config/sampler.run_settings`; `models/generate` consumes it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SamplerSettings:
    steps: int
    shift: float | None  # None: the model's scheduler config decides
    guidance: float

    def as_json(self) -> dict:
        return asdict(self)

    def replaced(self, steps: int | None, guidance: float | None) -> "SamplerSettings":
        """These settings with the steps and/or guidance given (not None) in their place."""
        return SamplerSettings(self.steps if steps is None else steps, self.shift, self.guidance if guidance is None else guidance)

    def resolved(self, parts) -> "SamplerSettings":
        """The same settings with an unset shift replaced by the flow shift `parts.scheduler` declares."""
        if self.shift is not None:
            return self
        return SamplerSettings(self.steps, float(parts.scheduler.config["flow_shift"]), self.guidance)
