"""Manifest loading: strict types, unknown keys with suggestions, overrides, every problem at once."""

import tomllib

import pytest

from cosmos_rl.config import load
from cosmos_rl.core import schema
from cosmos_rl.core.problems import ManifestError


def problems_of(raw: dict) -> dict[str, str]:
    with pytest.raises(ManifestError) as info:
        load.structure(raw)
    return {p.path: p.render() for p in info.value.problems}


def test_defaults_follow_the_nft_spec_table():
    rl = load.structure({"rl": {"algorithm": "nft"}}).rl
    assert isinstance(rl, schema.NFTConfig)
    # nft.md section 5, read off the table by hand
    assert (rl.group_size, rl.beta, rl.kl_beta, rl.policy_loss_scale) == (4, 1.0, 1.0, 5.0)
    assert (rl.advantage_low, rl.advantage_high, rl.r_map, rl.r_tau) == (-5.0, 5.0, "linear", 0.5)
    assert (rl.uniform_timestep, rl.sample_steps, rl.guidance) == (False, 20, 3.0)
    # Not the table's 5.0: unset means the model's own scheduler shift (the public Nano recipe's
    # value lives in its folder), and a manifest value overrides it.
    assert rl.sampler_shift is None
    assert (rl.rollout_seed_clock, rl.ref.update_every, rl.modality, rl.scheduler) == ("source_row", 0, "video", "unipc")


def test_dpo_defaults_and_tagged_union():
    config = load.structure({"rl": {"algorithm": "dpo"}})
    assert isinstance(config.rl, schema.DPOConfig)
    assert config.grid.backend == "local" and config.grid.grouping == "single"
    assert config.rl.data.cursor_resume is True


def test_unknown_key_suggests_the_sibling():
    found = problems_of({"rl": {"algorithm": "dpo", "betaa": 2.0}})
    assert "rl.betaa" in found and "did you mean rl.beta?" in found["rl.betaa"]


def test_unknown_key_suggests_a_field_elsewhere_in_the_tree():
    found = problems_of({"rl": {"algorithm": "nft", "seed": 3}})
    assert "did you mean job.seed?" in found["rl.seed"]


@pytest.mark.parametrize(
    "raw, path, text",
    [
        ({"rl": {"algorithm": "dpo", "max_steps": "5"}}, "rl.max_steps", 'expected an integer (got "5")'),
        ({"rl": {"algorithm": "dpo", "max_steps": True}}, "rl.max_steps", "expected an integer (got true)"),
        ({"rl": {"algorithm": "dpo", "max_steps": 2.5}}, "rl.max_steps", "expected an integer (got 2.5)"),
        ({"rl": {"algorithm": "dpo"}, "job": {"tensorboard": "false"}}, "job.tensorboard", "expected true or false"),
        ({"rl": {"algorithm": "dpo"}, "job": {"name": 7}}, "job.name", "expected a string (got 7)"),
        ({"rl": {"algorithm": "dpo"}, "grid": {"backend": "slurm"}}, "grid.backend", 'unknown option (got "slurm")'),
        ({"rl": {"algorithm": "nft", "r_map": "lin"}}, "rl.r_map", 'did you mean "linear"?'),
        ({"rl": {"algorithm": "dpo", "data": {"shards": "a.tar"}}}, "rl.data.shards", "expected a list"),
        ({"rl": {"algorithm": "dpo"}, "grid": {"shapes": {"policy": [1, "x"]}}}, "grid.shapes.policy[1]", "expected an integer"),
        ({"rl": {"algorithm": "dpo"}, "job": 3}, "job", "expected a table"),
    ],
)
def test_wrong_types_and_options_are_errors_never_coerced(raw, path, text):
    found = problems_of(raw)
    assert path in found, found
    assert text in found[path]


def test_integers_are_accepted_for_float_fields():
    assert load.structure({"rl": {"algorithm": "dpo", "beta": 5}}).rl.beta == 5.0


def test_algorithm_is_required_and_checked():
    assert "rl.algorithm" in problems_of({"job": {"name": "x"}})
    assert "rl.algorithm" in problems_of({"rl": {"beta": 1.0}})
    found = problems_of({"rl": {"algorithm": "ppo"}})
    assert 'use one of "dpo", "nft"' in found["rl.algorithm"]


def test_dpo_keys_are_unknown_under_nft():
    found = problems_of({"rl": {"algorithm": "nft", "pairs_per_step": 4}})
    assert "rl.pairs_per_step" in found


def test_a_key_of_the_other_algorithm_says_which_algorithm_owns_it():
    found = problems_of({"rl": {"algorithm": "dpo", "reward": {"url": "http://x"}}})
    assert found["rl.reward"] == (
        'rl.reward: unknown key; rl.reward belongs to NFT, and this manifest runs DPO; '
        'remove it, or set rl.algorithm = "nft"'
    )
    found = problems_of({"rl": {"algorithm": "nft", "data": {"synthetic_pairs": 8}}})
    assert 'rl.data belongs to DPO, and this manifest runs NFT; remove it, or set rl.algorithm = "dpo"' in found["rl.data"]


@pytest.mark.parametrize("value", [[1], {"name": "dpo"}, 3])
def test_a_non_string_algorithm_is_a_type_error_listing_the_options(value):
    found = problems_of({"rl": {"algorithm": value}})
    assert found["rl.algorithm"].startswith("rl.algorithm: expected a string naming the algorithm")
    assert found["rl.algorithm"].endswith('use one of "dpo", "nft", "sft", "grpo"')


def test_every_problem_is_reported_in_one_pass():
    found = problems_of({"rl": {"algorithm": "nft", "betaa": 1, "group_size": "4"}, "job": {"nme": "x", "seed": 1.5}, "x": 1})
    assert {"rl.betaa", "rl.group_size", "job.nme", "job.seed", "x"} <= set(found)


def test_rendered_problem_has_path_got_and_fix():
    line = problems_of({"rl": {"algorithm": "dpo", "max_steps": "5"}})["rl.max_steps"]
    assert line == 'rl.max_steps: expected an integer (got "5"); write an integer'


def test_overrides_are_toml_values():
    raw = load.apply_overrides({"rl": {"algorithm": "dpo"}}, ["rl.max_steps=5", 'job.name="x"', "rl.data.shards=['a.tar']", "grid.shapes={policy=[1,2]}"])
    assert raw["rl"]["max_steps"] == 5 and raw["job"]["name"] == "x"
    assert raw["rl"]["data"]["shards"] == ["a.tar"] and raw["grid"]["shapes"] == {"policy": [1, 2]}


def _hint(item: str) -> str:
    with pytest.raises(ManifestError) as info:
        load.apply_overrides({}, [item])
    return info.value.problems[0].fix


def _through_bash(words: str) -> list[str]:
    """The arguments bash passes on for `words` typed on a command line."""
    import subprocess

    return subprocess.run(["bash", "-c", f"printf '%s\\n' {words}"], capture_output=True, text=True, check=True).stdout.splitlines()


def test_bare_string_override_is_an_error_with_a_hint_a_shell_keeps():
    """`job.name="try2"` typed in bash arrives as job.name=try2 and loops; the hint quotes the TOML
    quotes for the shell, and what bash passes on is the override meant."""
    fix = _hint("job.name=try2")
    assert fix == "quote strings, with shell quotes around the TOML quotes: 'job.name=\"try2\"'"
    typed = fix.rsplit(": ", 1)[1]
    assert [load.parse_override(arg) for arg in _through_bash(typed)] == [("job.name", "try2")]
    typed = _hint("model.path=/data/it's here").rsplit(": ", 1)[1]  # a quote and a space in the value
    assert [load.parse_override(arg) for arg in _through_bash(typed)] == [("model.path", "/data/it's here")]


@pytest.mark.parametrize("item, fix, typed, means", [
    ("job.tensorboard=yes", "write true or false: job.tensorboard=true or job.tensorboard=false", "job.tensorboard=true", ("job.tensorboard", True)),
    ("rl.max_steps=ten", "write an integer, e.g. rl.max_steps=10", "rl.max_steps=10", ("rl.max_steps", 10)),
    ("grid.backend=ray", "write 'grid.backend=\"ray\"' (the TOML quotes inside shell quotes)", "'grid.backend=\"ray\"'", ("grid.backend", "ray")),
    ("rl.data.shards=a.tar", "write a TOML array inside shell quotes: 'rl.data.shards=[\"a.tar\"]'", "'rl.data.shards=[\"a.tar\"]'",
     ("rl.data.shards", ["a.tar"])),
])  # fmt: skip
def test_the_hint_follows_the_keys_type(item, fix, typed, means):
    """A bool key gets true/false (never the string "yes"), a number key a number, an option its
    choice, a list a TOML array; what the hint shows survives bash as a valid override."""
    assert _hint(item) == fix and typed in fix
    assert [load.parse_override(arg) for arg in _through_bash(typed)] == [means]


@pytest.mark.parametrize("item", ["rl.max_steps", "=5", "rl..beta=1"])
def test_malformed_override_items(item):
    with pytest.raises(ManifestError) as info:
        load.apply_overrides({}, [item])
    assert "KEY=VALUE" in info.value.problems[0].render()


def test_override_through_a_value_is_an_error():
    with pytest.raises(ManifestError) as info:
        load.apply_overrides({"job": {"name": "x"}}, ["job.name.first=1"])
    assert info.value.problems[0].path == "job.name"


def test_unknown_override_key_is_reported_with_suggestion(tmp_path):
    manifest = tmp_path / "m.toml"
    manifest.write_text('[rl]\nalgorithm = "dpo"\n')
    with pytest.raises(ManifestError) as info:
        load.load(manifest, ["rl.max_step=3"])
    assert "did you mean rl.max_steps?" in info.value.problems[0].render()


def test_toml_round_trip_is_lossless():
    config = load.structure({"rl": {"algorithm": "nft", "group_size": 8}, "grid": {"shapes": {"policy": [1, 8], "rollout": [1, 8]}}})
    again = load.structure(tomllib.loads(load.to_toml(config)))
    assert again == config


def test_invalid_toml_names_the_file(tmp_path):
    manifest = tmp_path / "bad.toml"
    manifest.write_text("[rl\nalgorithm = 1")
    with pytest.raises(ManifestError) as info:
        load.load(manifest)
    assert info.value.problems[0].path == str(manifest) and "not valid TOML" in info.value.problems[0].problem


def test_missing_manifest_file(tmp_path):
    with pytest.raises(ManifestError) as info:
        load.load(tmp_path / "nope.toml")
    assert "not found" in info.value.problems[0].problem


def test_structural_and_rule_problems_are_reported_together(tmp_path):
    manifest = tmp_path / "m.toml"
    manifest.write_text('[rl]\nalgorithm = "dpo"\nbeta = -1.0\nmax_stepz = 3\n[rl.data]\nsynthetic_pairs = 8\n')
    config, problems = load.load_all_problems(manifest)
    paths = {p.path for p in problems}
    assert config is None and {"rl.max_stepz", "rl.beta"} <= paths


def test_every_field_is_documented():
    import attrs

    def walk(cls, prefix):
        for f in attrs.fields(cls):
            assert f.metadata.get("doc"), f"{prefix}{f.name} has no doc"
            for t in (getattr(f.type, "__args__", None) or (f.type,)):
                if attrs.has(t):
                    walk(t, f"{prefix}{f.name}.")

    walk(schema.RunConfig, "")
    walk(schema.DPOConfig, "rl.")
    walk(schema.NFTConfig, "rl.")
