"""Hand a validated run to its backend. Filled in by the DPO and NFT backends."""

from __future__ import annotations

from cosmos_rl.errors import RunFailed


def train(config, manifest, overrides, console) -> int:
    raise RunFailed(f"the {config.rl.algorithm} backend is not built yet")


def resume(run_dir, overrides, exact, console) -> int:
    raise RunFailed("resume is not built yet")
