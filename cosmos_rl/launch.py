"""Hand a validated run to its backend; heavy imports happen only here and below."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from cosmos_rl import run as run_mod
from cosmos_rl.config import schema


def train(config: schema.RunConfig, manifest: Path, overrides: list[str], console) -> int:
    config, run_dir = run_mod.prepare_new(config, manifest)
    return _backend(config).start(config, run_dir, resume=False, exact=False, console=console)


def resume(run_dir: Path, overrides: list[str], exact: bool, console) -> int:
    config, notices = run_mod.load_for_resume(run_dir, overrides, exact=exact)
    for notice in notices:
        console.print(f"[yellow]notice[/]: {escape(notice)}", highlight=False)  # notices quote paths
    return _backend(config).start(config, Path(run_dir).resolve(), resume=True, exact=exact, console=console)


def _backend(config: schema.RunConfig):
    if isinstance(config.rl, schema.NFTConfig):
        from cosmos_rl.trainers import nft_driver

        return nft_driver
    from cosmos_rl.trainers import dpo_launch

    return dpo_launch
