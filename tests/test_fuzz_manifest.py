"""Property-based fuzzing of manifests and overrides: never a traceback, always problems with a path."""

import string
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, given, settings, strategies as st

from cosmos_rl.config import key_hints, load
from cosmos_rl.core.problems import ManifestError

ROOT = Path(__file__).resolve().parent.parent
KNOWN_PATHS = sorted(key_hints.every_path())

scalars = st.one_of(
    st.integers(min_value=-10**6, max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.text(alphabet=string.ascii_letters + string.digits + "._-:/ ", max_size=12),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "policy", "rollout"]), inner, max_size=2), max_leaves=5)
keys = st.one_of(st.sampled_from(KNOWN_PATHS), st.text(alphabet=string.ascii_lowercase + "._", min_size=1, max_size=15))


def set_path(raw: dict, path: str, value) -> None:
    parts = [p for p in path.split(".") if p]
    if not parts:
        return
    node = raw
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = node[part] = {}
        node = nxt
    node[parts[-1]] = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(st.tuples(keys, values), max_size=8), algorithm=st.sampled_from(["dpo", "nft", "grpo", 3]))
def test_random_manifests_give_problems_with_paths_never_exceptions(tmp_path_factory, entries, algorithm):
    raw = {"rl": {"algorithm": algorithm}}
    for path, value in entries:
        set_path(raw, path, value)
    manifest = tmp_path_factory.mktemp("fuzz") / "m.toml"
    manifest.write_text(tomli_w.dumps(raw))
    try:
        config, problems = load.load_all_problems(manifest)
    except ManifestError as exc:  # structural problems of the override/manifest layer itself
        problems, config = exc.problems, None
    for problem in problems:
        assert problem.path and problem.render().startswith(problem.path)
    if config is None:
        assert any(p.severity == "error" for p in problems)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(st.text(alphabet=string.printable, max_size=30), max_size=5))
def test_random_override_items_are_parsed_or_rejected_with_a_path(items):
    try:
        raw = load.apply_overrides({"rl": {"algorithm": "dpo"}}, items)
    except ManifestError as exc:
        assert exc.problems and all(p.path for p in exc.problems)
        return
    try:
        load.structure(raw)
    except ManifestError as exc:
        assert all(p.path for p in exc.problems)


def test_a_fuzzed_manifest_through_the_cli_exits_2_without_traceback(tmp_path):
    from _inproc import cosmos

    manifest = tmp_path / "m.toml"
    manifest.write_text('[rl]\nalgorithm = "nft"\ngroup_size = "many"\n[grid.shapes]\npolicy = [1, 2, {a = 1}]\n[job]\nseed = [1]\n')
    result = cosmos("validate", manifest)  # in-process (tests/_inproc.py): the exit code and the words are the subject
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "rl.group_size" in result.stderr and "job.seed" in result.stderr
