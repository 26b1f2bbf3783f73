"""The suite a run evaluates (`[rl.eval]`, and `cosmos-rl eval RUN_DIR` unless `--suite` names
another), from its manifest: `suites.registry.run_suite` over `rl.eval.suite`, `rl.eval.reward`, the
training rewards of an online run and the run's media. Torch-free."""

from __future__ import annotations

from cosmos_rl.core import schema
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites import registry
from cosmos_rl.suites.base import Suite



def train_rewards(rl: schema.RLBase) -> list[str]:
    """The reward names an online run trains on (`[rl.reward]` or each `[[rl.rewards]]`); none for DPO and SFT."""
    if not isinstance(rl, schema.OnlineRLBase):
        return []
    return [t.name for t in rl.rewards] if rl.rewards else [rl.reward.name]


def run_suite(config: schema.RunConfig) -> Suite:
    """The run's suite (an UnknownSuite when rl.eval.suite or a reward names a suite that cannot be imported)."""
    e = config.rl.eval
    clips = MediaSpec.from_model_config(config.model).is_video
    return registry.run_suite(e.suite, e.reward, train_rewards(config.rl), clips)
