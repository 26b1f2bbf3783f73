"""bench/coldstart_bench.py times what an NFT actor imports: its list must keep up with the trainer."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_coldstart", REPO / "bench" / "coldstart_bench.py")
coldstart = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(coldstart)


def _cosmos_imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level, inside-functions) cosmos_rl modules a file imports; `from pkg import mod` counts mod."""
    top, nested = set(), set()
    tree = ast.parse(path.read_text())
    module_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cosmos_rl"):
            names = set()
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                names.add(candidate if _is_module(candidate) else node.module)
            (top if id(node) in module_level else nested).update(names)
    return top, nested


def _is_module(name: str) -> bool:
    parts = name.split(".")
    base = REPO.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def test_the_cosmos_rl_stage_covers_every_module_the_nft_actor_imports():
    staged = set(coldstart.ALL_MODULES)
    # The actor class (its module-level imports; the rest of trainers/ray_driver.py is the driver's),
    # then the online step and NFT's half, whose lazy imports run in the actor too.
    assert {"cosmos_rl.trainers.ray_driver", "cosmos_rl.trainers.spmd_worker"} <= staged
    for name in ("online", "nft"):
        top, nested = _cosmos_imports(REPO / "cosmos_rl" / "trainers" / f"{name}.py")
        assert f"cosmos_rl.trainers.{name}" in staged
        missing = sorted(nested - staged - top)
        assert not missing, f"bench/coldstart_bench.py STAGES miss what trainers/{name}.py imports lazily: {missing}"


def test_the_timed_build_imports_are_staged_too():
    assert set(coldstart.BUILD_IMPORTS) <= set(coldstart.ALL_MODULES)
