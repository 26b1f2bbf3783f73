"""The docs stay a guide a user reads (docs/README-level pages), with the figures on one results page:

- a guide page stays within the length budget (a page that needs more is two tasks);
- a guide page, the troubleshooting table and the README carry no dated entry (dates, recipe
  histories and one-seed variants belong to docs/studies/);
- every figure they quote (a signed decimal such as +0.142, an interval such as [0.11, 0.17])
  appears on docs/results.md, where it has its command and commit;
- every manifest key they name in a code span exists (the generated reference lists it), and every
  command they quote parses and validates (tests/test_docs_pages.py checks each; here, that the
  check fails on a planted bad command);
- every relative link of docs/ and the README resolves, anchors included;
- the example reward service of docs/reward_service.md answers the project's own client.

Each rule is also run on a planted violation, so that a rule which silently stopped matching fails.
"""

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cosmos_rl.core.media import MediaSpec
from test_docs_pages import command_problem, commands_in, user_model, user_pairs  # noqa: F401 (fixtures)

from cosmos_rl.commands.docs_gen import generate

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results.md"
# Lookup pages are exempt from the length budget: the generated key reference and the table of
# every preflight message. The results page is where the figures live.
LOOKUP = ("manifest.md", "troubleshooting.md")
BUDGET = 300


def guide_pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if p.name not in LOOKUP and p != RESULTS)


def manual_pages() -> list[Path]:
    """The pages a user reads as the manual: the guide, the troubleshooting table and the README."""
    return guide_pages() + [DOCS / "troubleshooting.md", ROOT / "README.md"]


# ------------------------------------------------------------------------------------- the rules
def length_problems(name: str, text: str) -> list[str]:
    n = len(text.splitlines())
    return [f"{name}: {n} lines, over the guide budget of {BUDGET}: split it into two tasks"] if n > BUDGET else []


DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def date_problems(name: str, text: str) -> list[str]:
    # A link to a study names its dated file: that is a pointer to the record, not an entry.
    text = re.sub(r"\]\([^)\s]*\)", lambda m: "](" + " " * (len(m.group()) - 3) + ")", text)
    return [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: dated entry {m.group()!r}: move it to a study under docs/studies/"
            for m in DATE.finditer(text)]


def prose(text: str) -> str:
    """The text a reader reads as claims: fenced blocks and code spans removed (they hold what a user
    types and output formats, such as `+0.100 [0.06, 0.14]` in a description of eval's table)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


FIGURE = re.compile(r"(?<![\w.])[+-]\d+\.\d+(?![\w.])|\[-?\d+\.\d+, -?\d+\.\d+\]")


def figure_problems(name: str, text: str, results: str) -> list[str]:
    return [f"{name}: figure {f!r} is not on docs/results.md: quote the results page's figure, or add the row there with its command and commit"
            for f in sorted(set(FIGURE.findall(prose(text)))) if f not in results]


PREFIXES = ("job", "model", "grid", "checkpoint", "rl")
KEY_TOKEN = re.compile(r"(?P<key>(?:%s)(?:\.[a-z0-9_]+|\[[A-Za-z0-9]*\])+)(?:=.*)?" % "|".join(PREFIXES))
FILE_NAME = re.compile(r".*\.(safetensors|json|jsonl|toml|py|md|png|gif|txt|tar|mp4|pth|pt|bin)$")


def reference_keys() -> set[str]:
    """Every key of the generated reference; a table-valued (dict) key also stands for its fields
    (`grid.shapes.policy` of `grid.shapes = {policy = [1, 4]}`), written with a trailing `.*`."""
    keys = set()
    for key, kind in re.findall(r"^\| (\S+) \| ((?:[^|\\]|\\.)*) \|", generate(), flags=re.M):  # `\|` inside a type
        keys.add(key.strip("*"))
        if kind.strip().startswith("dict["):
            keys.add(key + ".*")
    return keys


def is_key(key: str, keys: set[str]) -> bool:
    key = re.sub(r"\[[A-Za-z0-9]*\]", "[]", key)
    # an index into a list value (`model.lora.target_modules[i]`) names the list's key, and a
    # table of several (`rl.rewards`) is written without its brackets
    if {key, key.removesuffix("[]"), key + "[]"} & keys:
        return True
    parts = key.split(".")
    return any(".".join(parts[:i]) + ".*" in keys for i in range(1, len(parts)))


def key_problems(name: str, text: str, keys: set[str]) -> list[str]:
    """A dotted manifest key in a code span (`rl.reward.url`, `rl.rewards[N].weight`, an override
    `rl.max_steps=5`) that the generated reference does not list."""
    bad = set()
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        for token in span.split():
            m = KEY_TOKEN.fullmatch(token.strip("'\""))
            if m and not FILE_NAME.fullmatch(m.group("key")) and not is_key(m.group("key"), keys):
                bad.add(m.group("key"))
    return [f"{name}: `{k}` is not a manifest key (docs/manifest.md lists them)" for k in sorted(bad)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(page: Path, text: str) -> list[str]:
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}: link to {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{page.name}: link to {target}: {dest.name} has no heading #{anchor}")
    return bad


# ------------------------------------------------------------------------------ on the real docs
def test_the_guide_is_the_pages_a_user_reads():
    names = {p.name for p in guide_pages()}
    for page in ("quickstart.md", "nft.md", "grpo.md", "dpo.md", "sft.md", "video.md", "rewards.md",
                 "reward_service.md", "eval.md", "checkpoints.md", "requeue.md", "topology.md", "scale.md", "security.md"):
        assert page in names, page
    assert RESULTS.is_file() and list((DOCS / "studies").glob("20??-??-??-*.md"))


def test_guide_pages_keep_the_length_budget():
    problems = [p for page in guide_pages() for p in length_problems(page.name, page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_manual_carries_no_dated_entry():
    problems = [p for page in manual_pages() for p in date_problems(page.name, page.read_text())]
    assert not problems, "\n".join(problems)


def test_every_quoted_figure_is_on_the_results_page():
    results = RESULTS.read_text()
    problems = [p for page in manual_pages() for p in figure_problems(page.name, page.read_text(), results)]
    assert not problems, "\n".join(problems)


def test_every_key_named_in_a_code_span_exists():
    keys = reference_keys()
    assert {"rl.reward.url", "rl.rewards[].weight", "model.lora.target_modules", "rl.eval"} <= keys
    pages = manual_pages() + [RESULTS]
    problems = [p for page in pages for p in key_problems(page.name, page.read_text(), keys)]
    assert not problems, "\n".join(problems)


def test_every_relative_link_resolves():
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
    problems = [p for page in pages for p in link_problems(page, page.read_text())]
    assert not problems, "\n".join(problems)


def test_the_results_page_shows_a_grid_and_a_clip_committed_small():
    text = RESULTS.read_text()
    pictures = re.findall(r"!\[[^\]]*\]\((results/[^)]+)\)", text)
    assert any(p.endswith(".png") for p in pictures) and any(p.endswith(".gif") for p in pictures), pictures
    for picture in pictures:
        assert (DOCS / picture).stat().st_size < 400_000, f"{picture} is over 400 KB: commit it smaller"


# ------------------------------------------------------------------------ each rule on a planted page
def test_the_length_rule_fails_on_a_long_page(tmp_path):
    page = tmp_path / "long.md"
    page.write_text("a line\n" * (BUDGET + 1))
    assert length_problems(page.name, page.read_text())
    assert not length_problems("short.md", "a line\n" * BUDGET)


def test_the_date_rule_fails_on_a_dated_entry(tmp_path):
    page = tmp_path / "dated.md"
    page.write_text("# A page\n\n**What the first recipe learned (2026-12-03).** It learned.\n")
    assert date_problems(page.name, page.read_text()) == [
        "dated.md:3: dated entry '2026-12-03': move it to a study under docs/studies/"]


def test_the_figure_rule_fails_on_a_figure_the_results_page_lacks(tmp_path):
    page = tmp_path / "figures.md"
    page.write_text("NFT reads +0.913 [0.91, 0.92] here and +0.142 [0.11, 0.17] there; "
                    "`+0.555 [0.50, 0.60]` is an output format.\n")
    results = "| NFT | +0.142 [0.11, 0.17] |\n"
    problems = figure_problems(page.name, page.read_text(), results)
    assert len(problems) == 2 and "'+0.913'" in problems[0] and "'[0.91, 0.92]'" in problems[1], problems


def test_the_key_rule_fails_on_an_unknown_key(tmp_path):
    page = tmp_path / "keys.md"
    page.write_text("Set `rl.reward.urll` and `rl.rewards[N].weight`, then `rl.max_stepz=5 job.seed=1`; "
                    "`model.lora.target_modules[i]`, `grid.shapes.policy`, `rl.rewards`, `model.safetensors` "
                    "and `checkpoint.dcp_io.SafeFileSystemReader` are fine.\n")
    problems = key_problems(page.name, page.read_text(), reference_keys())
    assert problems == ["keys.md: `rl.max_stepz` is not a manifest key (docs/manifest.md lists them)",
                        "keys.md: `rl.reward.urll` is not a manifest key (docs/manifest.md lists them)"]


def test_the_command_rule_fails_on_an_unknown_option_or_key(tmp_path, monkeypatch, user_model, user_pairs, shipped_manifests):
    page = tmp_path / "commands.md"
    page.write_text("```bash\ncosmos-rl eval preset:shapes --per-tusk 1\n"
                    "cosmos-rl validate manifests/nft_shapes_cpu.toml rl.max_stepz=5\n"
                    "cosmos-rl plan manifests/nft_shapes_cpu.toml rl.max_steps=5\n```\n")
    found = commands_in(page.name, page.read_text())
    assert len(found) == 3
    problems = [command_problem(p, c, monkeypatch, user_model, user_pairs, shipped_manifests) for p, c in found]
    assert "does not parse" in problems[0] and "--per-tusk" in problems[0]
    assert "does not validate" in problems[1] and "rl.max_stepz" in problems[1]
    assert problems[2] is None


def test_the_link_rule_fails_on_a_missing_file_or_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A `grid.backend = \"local\"` section\n")
    page = tmp_path / "links.md"
    page.write_text("[ok](other.md#a-gridbackend--local-section) [no file](gone.md) [no anchor](other.md#nowhere) "
                    "[web](https://example.com/x.md) [self](#links)\n\n# Links\n")
    assert link_problems(page, page.read_text()) == [
        "links.md: link to gone.md: no such file", "links.md: link to other.md#nowhere: other.md has no heading #nowhere"]


# --------------------------------------------------------------------- the example reward service
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_example_reward_service_answers_the_client(tmp_path):
    from cosmos_rl.rewards.client import RewardClient

    text = (DOCS / "reward_service.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (tmp_path / "my_reward.py").write_text(code)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "my_reward.py"), str(port)], stderr=subprocess.DEVNULL)
    try:
        client = RewardClient(f"http://127.0.0.1:{port}", "redness", "redness-v1", 10, 0, 0.0)
        for _ in range(100):  # the service binds within a second or two
            try:
                info = client.check_revision(MediaSpec.image(32))  # the run makes 32x32 images
                break
            except Exception:
                time.sleep(0.1)
        else:
            pytest.fail("the example service never answered GET /info")
        assert info["rewards"] == ["redness"]
        images = np.zeros((2, 32, 32, 3), np.uint8)
        images[0, ..., 0] = 255  # all red
        images[1, :8, :, 0] = 255  # a quarter red
        assert client.score(images, ["a", "b"]) == [1.0, 0.25]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ----------------------------------------------------------------- what the tool says it is, everywhere
ALGORITHMS = ("DPO", "NFT", "GRPO", "SFT")
MODES = ("text to image", "text to video", "image to video")


def names_problems(where: str, text: str) -> list[str]:
    return [f"{where} does not name {word!r}" for word in ALGORITHMS + MODES if word not in text]


def test_readme_help_and_description_name_the_four_algorithms_and_three_modes():
    import tomllib

    import typer.main

    from cosmos_rl.cli import app

    readme = (ROOT / "README.md").read_text().split("\n## ", 1)[0]  # the opening paragraph, before Set up
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    group = typer.main.get_command(app)
    problems = names_problems("README's opening", readme) + names_problems("pyproject's description", description)
    problems += names_problems("cosmos-rl --help", group.help)
    train = group.commands["train"].help
    problems += [f"cosmos-rl train --help does not name {w!r}" for w in ALGORITHMS if w not in train]
    assert not problems, "\n".join(problems)
    assert names_problems("a page", "DPO, NFT and SFT on text to image and text to video") == [
        "a page does not name 'GRPO'", "a page does not name 'image to video'"]
