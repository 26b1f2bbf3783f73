"""The algorithm registry: every built-in entry resolves, unknown names are refused (never another
algorithm's path), and an algorithm from outside the package (tests/standin_algorithms.py, named by
import string in the manifest) trains through the launch path on both launcher kinds."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest
import tomli_w
from rich.console import Console

from cosmos_rl.commands import launch
from cosmos_rl.planning import plan
from cosmos_rl.config import algorithms, load
from cosmos_rl.core import schema
from cosmos_rl.core.problems import ManifestError

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
CODE_FIELDS = ("trainer", "preflight", "plan_section", "checkpoint_contents", "data_check", "train_prompts")


def test_every_built_in_entry_resolves_and_names_its_own_config():
    for name in ("dpo", "nft", "sft", "grpo"):
        entry = algorithms.get(name)
        assert entry.name == name and issubclass(entry.config, schema.RLBase)
        assert entry.config.__attrs_attrs__.algorithm.type.__args__ == (name,)  # Literal["dpo"] ...
        for field in CODE_FIELDS:
            if getattr(entry, field):
                assert callable(entry.resolve(field)), f"{name}.{field} = {getattr(entry, field)!r}"


def _raw(algorithm: str, **rl) -> dict:
    return {"model": {"preset": "tiny"}, "rl": {"algorithm": algorithm, **rl}}


def test_an_unknown_algorithm_is_refused_with_the_options():
    with pytest.raises(ManifestError) as err:
        load.structure(_raw("ppo"))
    (problem,) = err.value.problems
    assert problem.path == "rl.algorithm" and problem.problem == "unknown algorithm"
    assert all(name in problem.fix for name in ('"dpo"', '"nft"', '"sft"', '"grpo"'))


def test_an_import_string_that_names_nothing_is_refused_naming_it():
    with pytest.raises(ManifestError) as err:
        load.structure(_raw("no_such_module_here:ENTRY"))
    (problem,) = err.value.problems
    assert problem.path == "rl.algorithm" and "no_such_module_here:ENTRY" in problem.problem
    with pytest.raises(ManifestError, match="not a cosmos_rl.config.algorithms.Algorithm"):
        load.structure(_raw("standin_algorithms:PlainFlowConfig"))


def test_register_refuses_a_second_entry_under_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        algorithms.register(algorithms.Algorithm(name="dpo", config=schema.SFTConfig, title="x", launcher="ranks", trainer="x:y"))


def test_a_manifest_names_a_stand_in_and_gets_its_own_table_rules_and_plan():
    config = load.structure(_raw("standin_algorithms:RANKS", samples_per_step=4, max_steps=3))
    assert type(config.rl).__name__ == "PlainFlowConfig" and config.rl.samples_per_step == 4
    # its own rules run (and only its own: no NFT or DPO rule fires on its table)
    problems = __import__("cosmos_rl.config.preflight", fromlist=["check"]).check(
        load.structure(_raw("standin_algorithms:RANKS", samples_per_step=0)))
    assert [p.path for p in problems if p.severity == "error"] == ["rl.samples_per_step"]
    # a key of another algorithm's table is named as such
    with pytest.raises(ManifestError, match=r"rl\.beta: unknown key"):
        load.structure(_raw("standin_algorithms:RANKS", beta=1.0))
    shown = plan.build(config)
    assert shown["algorithm"] == "standin_algorithms:RANKS" and shown["world_size"] == 1
    online = load.structure(_raw("standin_algorithms:ONLINE", group_size=3, init_from="preset:tiny"))
    assert plan.build(online)["shapes"] == {"policy": [1, 3], "rollout": [1, 3]}
    assert plan.seed_contract(online)["rl.group_size"] == 3


def test_the_stand_in_module_is_exactly_the_pieces_adding_an_algorithm_lists():
    """docs/architecture.md, "Adding an algorithm": one module outside the package holding configs,
    rules, a loss, rank trainers and entries; the stand-in is its worked example."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Adding an algorithm", 1)[1].split("\n## ", 1)[0]
    assert "tests/standin_algorithms.py" in section
    tree = ast.parse((TESTS / "standin_algorithms.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    assert defined == {
        "PlainFlowConfig", "RewardWeightedConfig",  # configs
        "plain_rules", "weighted_rules",  # preflight rules
        "weighted_velocity_mse",  # the loss
        "PlainFlowTrainer", "RewardWeightedTrainer",  # steps
        "RANKS", "ONLINE",  # entries
    }
    for piece in ("schema.RLBase", "schema.OnlineRLBase", "SPMDTrainer", "OnlineTrainer", "algorithms.online", 'rl.algorithm = "module:ENTRY"'):
        assert piece in section, piece


def _manifest(tmp_path: Path, name: str, grid: dict, rl: dict, **extra) -> Path:
    raw = {
        "job": {"name": name, "output_dir": str(tmp_path), "seed": 0, "progress": False},
        "model": {"preset": "tiny", "image_size": 32, "lora": {"rank": 4, "alpha": 8.0}},
        "grid": {"device": "cpu", **grid},
        "rl": rl,
        "checkpoint": {"every": 1, "keep": 0},
        **extra,
    }
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _train(path: Path) -> Path:
    config = load.load(path)
    from cosmos_rl.config import preflight

    assert [p for p in preflight.check(config, path.parent) if p.severity == "error"] == []
    assert launch.train(config, path, Console(stderr=True)) == 0
    return Path(config.job.output_dir) / config.job.name


@pytest.mark.slow
def test_the_ranks_stand_in_trains_two_steps_under_torchrun(tmp_path, monkeypatch):
    # torchrun's ranks import the stand-in module by name, as any user's module would be
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    path = _manifest(tmp_path, "ranks", {"backend": "local"}, {"algorithm": "standin_algorithms:RANKS", "max_steps": 2})
    run_dir = _train(path)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and all(r["train/loss"] > 0 for r in rows)
    from cosmos_rl.checkpoint import layout

    assert layout.committed_steps(layout.checkpoints_root(run_dir)) == [1, 2]
    meta = json.loads((run_dir / "checkpoints" / "step_2" / "meta.json").read_text())
    assert meta["algorithm"] == "standin_algorithms:RANKS"


@pytest.mark.slow
def test_the_online_stand_in_trains_two_steps_from_the_ray_driver(tmp_path, ray_cluster):
    rl = {
        "algorithm": "standin_algorithms:ONLINE", "init_from": "preset:tiny", "max_steps": 2, "group_size": 2,
        "prompts_per_step": 2, "sample_steps": 4, "guidance": 1.0, "sample_grid_every": 0,
        "reward": {"name": "brightness", "revision": "builtin-v1"},
    }  # fmt: skip
    path = _manifest(tmp_path, "online", {"backend": "ray"}, rl)
    run_dir = _train(path)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert {"train/reward_mean", "train/loss", "train/mse", "train/grad_norm"} <= set(rows[0])
    assert rows[0]["train/loss"] != rows[1]["train/loss"]
    meta = json.loads((run_dir / "checkpoints" / "step_2" / "meta.json").read_text())
    assert meta["algorithm"] == "standin_algorithms:ONLINE" and meta["extra"]["seed_contract"]["rl.group_size"] == 2
    assert re.search(r"standin_algorithms:ONLINE", (run_dir / "manifest.toml").read_text())
