"""The hand-written docs stay true: every preflight rule has a troubleshooting entry, every quoted
`cosmos-rl` command (README and docs/) parses, and every manifest command in them validates."""

import ast
import re
import shlex
from pathlib import Path

import pytest
import typer.main
from _model_folders import stub_model_folder

from cosmos_rl.cli import app
from cosmos_rl.config import load

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# the preflight package: its entry and every rules module (rewards.py, data.py, nft.py, ...)
PREFLIGHT = sorted((ROOT / "cosmos_rl" / "config" / "preflight").glob("*.py"))
PAGES = ("quickstart.md", "dpo.md", "nft.md", "grpo.md", "sft.md", "video.md", "topology.md", "troubleshooting.md")
RULE_HELPERS = {"error", "warn", "at_least", "positive", "local_path"}


def _pattern(node) -> str | None:
    """A regex for a (possibly f-string) argument: literal text escaped, each {...} as a wildcard."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".+?" for v in node.values)
    return None  # a variable: the rule's text is spelled out elsewhere in the file


def preflight_rules() -> list[tuple[str, str | None, str | None]]:
    """(file:line, path regex, problem regex) of every r.<helper>(...) call and every nft_shapes problem tuple."""
    rules = []
    nodes = [(path.name, node) for path in PREFLIGHT for node in ast.walk(ast.parse(path.read_text()))]
    for file, node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner, name = node.func.value, node.func.attr
        if isinstance(owner, ast.Name) and owner.id == "r" and name in RULE_HELPERS:
            problem = _pattern(node.args[1]) if name in ("error", "warn") else None
            rules.append((f"{file}:{node.lineno}", _pattern(node.args[0]), problem))
        elif isinstance(owner, ast.Name) and owner.id == "bad" and name == "append":
            path, problem = node.args[0].elts[:2]
            rules.append((f"{file}:{node.lineno}", _pattern(path), _pattern(problem)))
    return rules


def test_the_rule_extractor_sees_the_rules():
    rules = preflight_rules()
    assert len(rules) > 60
    assert any(p and re.fullmatch(p, "grid.rdzv_endpoint") for _, p, _ in rules)
    assert any(m and re.fullmatch(m, "must split evenly over the 4 ranks") for _, _, m in rules)


def test_every_preflight_rule_has_a_troubleshooting_entry():
    text = (DOCS / "troubleshooting.md").read_text()
    missing = []
    for line, path, problem in preflight_rules():
        if path and not re.search(f"`{path}`", text):
            missing.append(f"{line}: no entry for key /{path}/")
        if problem and not re.search(problem, text):
            missing.append(f"{line}: message /{problem}/ not quoted")
    assert not missing, "docs/troubleshooting.md is missing:\n" + "\n".join(missing)


# ------------------------------------------------------------------------------------ commands
def commands_in(page: str, text: str) -> list[tuple[str, str]]:
    """(page, command) for each `cosmos-rl ...` line in a bash fence and each inline `cosmos-rl ...` span.

    A fenced line may end with `# exits 2`: an example of a refused manifest, which must stay refused.
    """
    found = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if re.match(r"^(\w+=\S+\s+)*cosmos-rl\s", line.strip()):
                found.append((page, line.strip()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    # A bare `cosmos-rl train` in prose names the command; with arguments it is a command line.
    found += [(page, span) for span in re.findall(r"`(cosmos-rl\s+[\w-]+(?:\s+[\w-]+)?\s[^`]+)`", prose)]
    return found


def quoted_commands() -> list[tuple[str, str]]:
    """Every command the README and the pages of docs/ quote (the dated studies under docs/studies/
    record what ran then, and are not held to today's options)."""
    found = commands_in("README.md", (ROOT / "README.md").read_text())
    for page in sorted(DOCS.glob("*.md")):
        found += commands_in(page.name, page.read_text())
    return found


def test_the_pages_exist_and_quote_commands():
    for page in PAGES:
        assert (DOCS / page).is_file(), page
    pages = {page for page, _ in quoted_commands()}
    assert {"README.md", "quickstart.md", "topology.md", "dpo.md", "nft.md", "grpo.md", "sft.md", "video.md", "results.md"} <= pages


# The docs write the reader's own Cosmos3 model folder as this path; the test puts a folder of that
# layout (what preflight reads of it) in its place.
USER_MODEL = "/models/cosmos3-nano"
# Likewise the reader's own clip pairs (docs/video.md): a file there is what preflight reads of them.
USER_PAIRS = "/data/clip_pairs/pairs.jsonl"
USER_EPISODES = "/data/pusht_lerobot"  # a LeRobot dataset folder (docs/world.md): an empty folder validates without --data
USER_KEYS = "/data/pusht_windows.txt"  # its window keys (docs/world_training.md): preflight reads the file, the run checks each key


@pytest.fixture(scope="module")
def user_model(tmp_path_factory) -> Path:
    return stub_model_folder(tmp_path_factory.mktemp("docs") / "cosmos3-nano", flow_shift=5.0)


@pytest.fixture(scope="module")
def user_pairs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("docs_pairs") / "pairs.jsonl"
    path.write_text("")
    (path.parent / "episodes").mkdir()
    (path.parent / "keys.txt").write_text(f"lerobot window episode=0 start=0 root={path.parent / 'episodes'}\n")
    return path


def command_problem(page, command, monkeypatch, user_model, user_pairs, shipped_manifests) -> str | None:
    """Why a quoted command would not run as printed (an unknown command, option or key, a manifest
    that does not exist or does not validate, or a refused example that validates), or None."""
    command, _, comment = command.partition(" #")
    refused = comment.strip() == "exits 2"
    words = shlex.split(command)
    while re.fullmatch(r"\w+=\S*", words[0]):  # leading VAR=value environment assignments
        key, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(key, value)
    assert words[0] == "cosmos-rl"
    args = words[1:]
    group = typer.main.get_command(app)
    names = []
    while hasattr(group, "commands"):  # walk groups such as `reward serve`
        names.append(args[0])
        group = group.commands.get(args.pop(0))
        if group is None:
            return f"{page}: unknown command in `{command}`"
    try:
        ctx = group.make_context(" ".join(names), list(args), resilient_parsing=False)
    except Exception as exc:  # typer ships its own click, so match its UsageError by name
        if not any(c.__name__ == "UsageError" for c in type(exc).__mro__):
            raise
        return f"{page}: `{command}` does not parse: {exc}"
    if names[0] in ("validate", "plan", "train"):
        manifest = ROOT / ctx.params["manifest"]
        if not manifest.is_file():
            return f"{page}: `{command}` names a manifest that does not exist"
        if manifest.parent == ROOT / "manifests":  # beside the data its header says to write first
            manifest = shipped_manifests / manifest.name
        overrides = [o.replace(USER_MODEL, str(user_model)).replace(USER_PAIRS, str(user_pairs)).replace(USER_EPISODES, str(user_pairs.parent / "episodes")).replace(USER_KEYS, str(user_pairs.parent / "keys.txt")) for o in ctx.params["overrides"] or []]
        config, problems = load.load_all_problems(manifest, overrides)
        errors = [p.render() for p in problems if p.severity == "error"]
        if refused and not errors:
            return f"{page}: `{command}` is shown as refused but validates"
        if not refused and (config is None or errors):
            return f"{page}: `{command}` does not validate: {errors}"
    return None


@pytest.mark.parametrize("page,command", quoted_commands())
def test_quoted_command_parses_and_its_manifest_validates(page, command, monkeypatch, user_model, user_pairs, shipped_manifests):
    problem = command_problem(page, command, monkeypatch, user_model, user_pairs, shipped_manifests)
    assert problem is None, problem
