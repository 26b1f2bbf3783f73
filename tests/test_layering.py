"""The import graph of `cosmos_rl/`: no file cycle, and every import keeps the layers that
docs/architecture.md ("Layers") states.

Every `.py` under `cosmos_rl/` is parsed with `ast`, so every import counts: top level, inside a
function, under `TYPE_CHECKING`. `from pkg import name` is an edge to `pkg.name` when that is a
module, else to `pkg`. A name passed as a string (`importlib.import_module`, a "module:function"
table, a printed `python -m` command) is no edge, but it must name a module that exists.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "cosmos_rl"
ARCHITECTURE = REPO / "docs" / "architecture.md"

# Top to bottom: a module may import modules of its own layer and of the layers below it. Paths are
# relative to cosmos_rl/: "x/" is a package and everything in it, "x.py" one module; a module
# belongs to its most specific entry. docs/architecture.md "Layers" states the same table.
LAYERS = [
    ("cli", "cli.py"),
    ("commands", "commands/"),
    ("trainers", "trainers/"),
    ("evaluation", "evaluation/"),
    ("planning", "planning/"),
    ("config", "config/"),
    ("models", "models/"),
    ("rewards", "rewards/"),
    ("suites", "suites/"),
    ("worlds", "shapes/ pusht/"),
    ("data", "data/"),
    ("checkpoint", "checkpoint/"),
    ("dist", "dist/"),
    ("algorithms", "algorithms/"),
    ("core", "__init__.py core/"),
]

# Layers whose modules may import only the standard library, these packages and their own layer.
PURE = {"algorithms": {"torch"}}

# (importer, imported, why): imports allowed to go up, each to be removed by the named work.
EXCEPTIONS: list[tuple[str, str, str]] = []


# ----------------------------------------------------------------------------------- the checker
def module_of(path: str) -> tuple[str, bool]:
    """'config/' -> ('cosmos_rl.config', True: a package prefix); 'cli.py' -> ('cosmos_rl.cli', False)."""
    if path == "__init__.py":
        return "cosmos_rl", False
    if path.endswith("/"):
        return "cosmos_rl." + path.rstrip("/").replace("/", "."), True
    return "cosmos_rl." + path.removesuffix(".py").replace("/", "."), False


def layer_of(module: str, layers: list[tuple[str, str]]) -> str | None:
    """The layer of `module`: its most specific entry (a module beats the package around it)."""
    best, best_len = None, -1
    for name, paths in layers:
        for path in paths.split():
            entry, prefix = module_of(path)
            hit = module == entry or (prefix and module.startswith(entry + "."))
            if hit and len(entry) > best_len:
                best, best_len = name, len(entry)
    return best


def _matches(module: str, path: str) -> bool:
    entry, prefix = module_of(path)
    return module == entry or (prefix and module.startswith(entry + "."))


def discover(root: Path) -> dict[str, Path]:
    """Module name -> file, for every .py under `root` (the folder of the package `root.name`)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path], top: str) -> tuple[set[str], list[str]]:
    """(modules of `top` that `module` imports, imported names of `top` that are no module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets, missing = set(), []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == top or alias.name.startswith(top + "."):
                    (targets.add if alias.name in modules else missing.append)(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == top or source.startswith(top + ".")):
                continue
            if source not in modules:
                missing.append(source)
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in modules else source)
    targets.discard(module)
    return targets, missing


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    modules = discover(root)
    graph, missing = {}, {}
    for module, path in modules.items():
        graph[module], gone = imports_of(module, path, modules, root.name)
        if gone:
            missing[module] = gone
    return graph, missing


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_breaches(graph: dict[str, set[str]], layers=LAYERS, exceptions=EXCEPTIONS) -> tuple[list[str], set[int]]:
    """(one line per import that goes up a layer, the indexes of the exceptions that were used)."""
    rank = {name: i for i, (name, _) in enumerate(layers)}
    breaches, used = [], set()
    for module in sorted(graph):
        here = layer_of(module, layers)
        if here is None:
            breaches.append(f"{module} is in no layer: add it to LAYERS and to docs/architecture.md")
            continue
        for target in sorted(graph[module]):
            there = layer_of(target, layers)
            if there is None or rank[there] >= rank[here]:
                continue
            allowed = [i for i, (a, b, _) in enumerate(exceptions) if _matches(module, a) and _matches(target, b)]
            if allowed:
                used.update(allowed)
            else:
                breaches.append(f"{module} ({here}) imports {target} ({there}), a layer above it")
    return breaches, used


def impurities(root: Path, layers=LAYERS, pure=PURE) -> list[str]:
    """Imports of a pure layer's modules beyond the standard library, its packages and its own layer."""
    found = []
    for module, path in discover(root).items():
        layer = layer_of(module, layers)
        if layer not in pure:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top == root.name:
                    if layer_of(name, layers) != layer:
                        found.append(f"{module} ({layer}, pure) imports {name}")
                elif top not in sys.stdlib_module_names and top not in pure[layer]:
                    found.append(f"{module} ({layer}, pure) imports {name}")
    return found


# -------------------------------------------------------------------------------- the package
def test_every_import_names_a_module_that_exists():
    _, missing = import_graph(PACKAGE)
    assert not missing, f"imports of modules that do not exist (moved or renamed?): {missing}"


def test_no_file_cycle():
    graph, _ = import_graph(PACKAGE)
    assert cycles(graph) == [], "files that import each other, directly or around a circle"


def test_every_import_keeps_the_layers():
    graph, _ = import_graph(PACKAGE)
    breaches, used = layer_breaches(graph)
    assert not breaches, "\n".join(breaches)
    stale = [f"{a} -> {b}" for i, (a, b, _) in enumerate(EXCEPTIONS) if i not in used]
    assert not stale, f"exceptions no import needs any more: delete them here and in docs/architecture.md: {stale}"


def test_pure_layers_import_only_what_they_may():
    assert impurities(PACKAGE) == []


def stale_module_strings(root: Path) -> list[str]:
    """String constants that are exactly "pkg.module" or "pkg.module:function" of `root`'s package
    (an import string, a `python -m` argv) and name no module of it. Strings whose first part after
    the package is none of its modules ("cosmos_rl.json", a file name) are not module names."""
    modules = discover(root)
    tops = {name.split(".")[1] for name in modules if "." in name}
    pattern = re.compile(re.escape(root.name) + r"(?:\.\w+)+(?::\w+)?")
    stale = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.fullmatch(node.value):
                name = node.value.split(":")[0]
                if name.split(".")[1] in tops and name not in modules:
                    stale.append(f"{module}: {node.value!r}")
    return stale


def test_module_names_in_strings_exist():
    assert stale_module_strings(PACKAGE) == []


def _doc_layers() -> tuple[list[tuple[str, str]], str]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    rows = []
    for line in block.splitlines():
        name, _, rest = line.partition(" ")
        rows.append((name, " ".join(rest.split("(", 1)[0].split())))
    return rows, section


def test_the_architecture_doc_states_the_same_layers_and_exceptions():
    rows, section = _doc_layers()
    assert rows == LAYERS
    for importer, imported, _ in EXCEPTIONS:
        assert f"`{importer}` -> `{imported}`" in section, (importer, imported)
    assert len(EXCEPTIONS) <= 3, "issue 20: at most 3 exceptions"


# -------------------------------------------------------------------------------- the checker
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "cosmos_rl"
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


def test_the_checker_sees_a_layer_breach_in_a_function_local_import(tmp_path):
    root = _package(tmp_path, {
        "planning/__init__.py": "",
        "planning/plan.py": "import json\n",
        "models/__init__.py": "",
        "models/build.py": "def f():\n    from cosmos_rl.planning import plan\n    return plan\n",
    })  # fmt: skip
    graph, missing = import_graph(root)
    assert missing == {} and graph["cosmos_rl.models.build"] == {"cosmos_rl.planning.plan"}
    breaches, _ = layer_breaches(graph)
    assert breaches == ["cosmos_rl.models.build (models) imports cosmos_rl.planning.plan (planning), a layer above it"]
    # Downward is fine, and a listed exception lets exactly its import through.
    assert layer_breaches({"cosmos_rl.planning.plan": {"cosmos_rl.models.build"}, "cosmos_rl.models.build": set()})[0] == []
    allowed, used = layer_breaches(graph, exceptions=[("models/build.py", "planning/plan.py", "test")])
    assert allowed == [] and used == {0}


def test_the_checker_sees_a_cycle_through_relative_and_package_imports(tmp_path):
    root = _package(tmp_path, {
        "data/__init__.py": "",
        "data/a.py": "from . import b\n",
        "data/b.py": "from cosmos_rl.data.c import thing\n",
        "data/c.py": "import cosmos_rl.data.a\nthing = 1\n",
        "data/d.py": "from cosmos_rl.data import c\n",
    })  # fmt: skip
    graph, _ = import_graph(root)
    assert cycles(graph) == [["cosmos_rl.data.a", "cosmos_rl.data.b", "cosmos_rl.data.c"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_the_checker_sees_missing_modules_unplaced_modules_and_impure_imports(tmp_path):
    root = _package(tmp_path, {
        "algorithms/__init__.py": "",
        "algorithms/loss.py": "import math\nimport torch\nimport numpy\nfrom cosmos_rl.core.flow import x\nfrom cosmos_rl.algorithms import other\n",
        "algorithms/other.py": "",
        "core/__init__.py": "",
        "core/flow.py": "x = 1\n",
        "newthing.py": "from cosmos_rl.models.gone import f\n",
    })  # fmt: skip
    graph, missing = import_graph(root)
    assert missing == {"cosmos_rl.newthing": ["cosmos_rl.models.gone"]}
    assert "cosmos_rl.newthing is in no layer" in layer_breaches(graph)[0][0]
    assert sorted(impurities(root)) == [
        "cosmos_rl.algorithms.loss (algorithms, pure) imports cosmos_rl.core.flow",
        "cosmos_rl.algorithms.loss (algorithms, pure) imports numpy",
    ]


def test_the_checker_sees_a_string_naming_a_moved_module(tmp_path):
    root = _package(tmp_path, {
        "models/__init__.py": "",
        "models/build.py": 'A = {"x": "cosmos_rl.models.gone:build", "y": "cosmos_rl.models.build:f"}\n'
                           'ARGV = ["-m", "cosmos_rl.models.old_worker"]\nINFO = "cosmos_rl.json"\n',
    })  # fmt: skip
    assert stale_module_strings(root) == [
        "cosmos_rl.models.build: 'cosmos_rl.models.gone:build'",
        "cosmos_rl.models.build: 'cosmos_rl.models.old_worker'",
    ]


@pytest.mark.parametrize("module, layer", [
    ("cosmos_rl.core.schema", "core"), ("cosmos_rl.config.preflight", "config"), ("cosmos_rl.planning.run_dir", "planning"),
    ("cosmos_rl.core.run_lock", "core"), ("cosmos_rl.shapes.verifier", "worlds"), ("cosmos_rl.models.shapes_preset", "models"),
    ("cosmos_rl", "core"), ("cosmos_rl.cli", "cli"), ("cosmos_rl.newthing", None),
])  # fmt: skip
def test_a_module_belongs_to_its_most_specific_entry(module, layer):
    assert layer_of(module, LAYERS) == layer


# ------------------------------------------------------------------------- folders are the layers
# Top-level modules besides the package's face: only the entry point `python -m cosmos_rl.cli` runs.
TOP_LEVEL_MODULES = {"cli.py", "__init__.py"}


def folder_layer_problems(root: Path, layers=LAYERS) -> list[str]:
    """Where a folder is not one layer: a LAYERS entry that names a module inside a folder (a folder
    split across layers), a top-level module other than TOP_LEVEL_MODULES, a folder in no layer."""
    problems = []
    for name, paths in layers:
        for path in paths.split():
            if not path.endswith("/") and path not in TOP_LEVEL_MODULES:
                problems.append(f"layer {name}: {path} is a module, not a folder: a folder is one layer")
            if path.endswith("/") and path.count("/") > 1:
                problems.append(f"layer {name}: {path} is a sub-folder: a layer is a top-level folder")
    for path in sorted(root.iterdir()):
        rel = path.name + ("/" if path.is_dir() else "")
        if path.is_dir() and not any(path.rglob("*.py")):
            continue  # data folders (no module)
        if path.suffix == ".py" and rel not in TOP_LEVEL_MODULES:
            problems.append(f"{rel}: a module at the top: move it into the folder of its layer")
        if path.is_dir() and layer_of(module_of(rel)[0], layers) is None:
            problems.append(f"{rel}: a folder in no layer")
    return problems


def test_folders_are_the_layers():
    assert folder_layer_problems(PACKAGE) == []


def test_the_folder_rule_sees_a_split_folder_and_a_stray_module(tmp_path):
    root = _package(tmp_path, {"cli.py": "", "stray.py": "", "models/__init__.py": "", "models/a.py": "", "data/__init__.py": ""})
    layers = [("cli", "cli.py"), ("models-top", "models/a.py"), ("models", "models/"), ("core", "__init__.py")]
    assert folder_layer_problems(root, layers) == [
        "layer models-top: models/a.py is a module, not a folder: a folder is one layer",
        "data/: a folder in no layer",
        "stray.py: a module at the top: move it into the folder of its layer",
    ]
