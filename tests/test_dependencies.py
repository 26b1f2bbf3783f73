"""Every third-party module the package imports comes from a distribution `pyproject.toml` declares,
or from one a declared distribution requires (named here, and checked against its installed
metadata), so a clean install (README's first command, `.ci/run`) has everything the code imports.
scipy was imported for months while nothing declared or required it: it was installed by chance."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Imported directly, installed through a declared dependency (its requirement, with the extra we ask for).
THROUGH = {
    "opencv-python": ("gym-pusht", ""),  # cv2: the Push-T renderer's frames
    "pygame": ("gym-pusht", ""),
    "pymunk": ("gym-pusht", ""),  # gym-pusht pins pymunk < 7, whose API the simulator wrapper uses
    "shapely": ("gym-pusht", ""),
    "grpcio": ("ray", "serve"),  # dist/warm_workers.py asks the raylet for its workers
    "botocore": ("boto3", ""),  # the s3 extra's client
}
# Imported only when a manifest asks for it, with an install hint then (core/metrics.py).
ON_REQUEST = {"wandb"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[;( ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    return names | {_name(r) for group in project["optional-dependencies"].values() for r in group}


def _imported() -> dict[str, str]:
    """top-level module -> one file importing it, for every absolute non-stdlib import in the package."""
    found = {}
    for path in sorted((ROOT / "cosmos_rl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "cosmos_rl":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_distribution_is_declared_or_required_by_a_declared_one():
    declared, owners = _declared(), metadata.packages_distributions()
    problems = []
    for module, where in sorted(_imported().items()):
        if module in ON_REQUEST:
            continue
        dists = {_name(d) for d in owners.get(module, [])}
        if not dists:
            problems.append(f"{module} ({where}): no installed distribution provides it")
        elif not dists & (declared | set(THROUGH)):
            problems.append(f"{module} ({where}): from {sorted(dists)}, which pyproject.toml does not declare")
    assert not problems, problems


def test_each_transitive_dependency_is_required_by_its_named_parent():
    declared = _declared()
    for dist, (parent, extra) in THROUGH.items():
        assert parent in declared, f"{dist}: its parent {parent} is not declared"
        wanted = [r for r in metadata.requires(parent) or [] if _name(r) == dist]
        marker_ok = [r for r in wanted if "extra ==" not in r or (extra and f'extra == "{extra}"' in r)]
        assert marker_ok, f"{parent} does not require {dist} (with extra {extra!r}): {wanted}"
    # The extra named for ray is the one pyproject asks for.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.replace(" ", "").startswith("ray[serve]") for r in project["dependencies"])
