"""`cosmos-rl pairs mine`: the best-vs-worst rule by hand, and the command on the shipped shapes base
writing shards the DPO reader takes, whose scores the verifier confirms, the same on every call."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from _inproc import cosmos

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.tar_pairs import TarShardPairs
from cosmos_rl.commands.mining.select import best_vs_worst
from cosmos_rl.shapes import verify

PROMPTS = ["a red circle", "two squares", "a blue triangle above a green square", "a circle and a square",
           "three yellow circles", "a square"]


def test_best_vs_worst_takes_the_first_highest_and_the_first_lowest_and_drops_ties():
    assert best_vs_worst([0.2, 0.9, 0.1, 0.9]) == (1, 2)
    assert best_vs_worst([0.5, 0.0, 0.0, 1.0]) == (3, 1)
    assert best_vs_worst([1, 0]) == (0, 1)
    assert best_vs_worst([0.25, 0.25, 0.25]) is None
    with pytest.raises(ValueError, match="at least 2"):
        best_vs_worst([1.0])
    with pytest.raises(ValueError, match="numbers"):
        best_vs_worst([float("nan"), 1.0])


def _mine(tmp_path: Path, out: str, *extra: str):
    """In-process (tests/_inproc.py): the shards, the JSON and the exit code are the subject, not the process."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    return cosmos("pairs", "mine", "preset:shapes", "--reward", "shapes_partial", "--prompts", prompts, "--samples", "3",
                  "--out", tmp_path / out, "--json", "--device", "cpu", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mine")
    done = _mine(tmp, "a")
    assert done.returncode == 0, done.stderr
    (tmp / "a.stderr").write_text(done.stderr)
    return tmp, json.loads(done.stdout)


def test_mined_pairs_are_read_by_the_dpo_reader_and_their_scores_hold(mined):
    tmp, summary = mined
    assert summary["rows"] == len(PROMPTS) and summary["pairs"] + summary["ties_dropped"] == len(PROMPTS)
    assert summary["pairs"] >= 1 and summary["ranked_by"] == "partial" and summary["sampler"]["guidance"] == 3.0
    # Not a terminal (captured): no bar; plain progress lines instead (the first count, the last, and every 30 s).
    assert f"mining: {len(PROMPTS)} of {len(PROMPTS)} prompt rows" in (tmp / "a.stderr").read_text()
    pairs = TarShardPairs(summary["shards"], MediaSpec.image(32))
    assert len(pairs) == summary["pairs"]
    with tarfile.open(summary["shards"][0]) as tar:
        metas = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")]
    for index, meta in enumerate(metas):
        pair = pairs[index]
        assert pair.id == meta["id"] and pair.prompt == meta["prompt"] and meta["prompt"] in PROMPTS
        assert meta["winner_score"] > meta["loser_score"]
        assert meta["winner_score"] == max(meta["scores"]) and meta["loser_score"] == min(meta["scores"])
        assert len(meta["scores"]) == 3 and len(meta["strict"]) == 3
        # The verifier re-reads the stored images (PNG is lossless) and gives the recorded scores.
        images = [(side.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for side in (pair.winner, pair.loser)]
        verdicts = verify(np.stack(images), [meta["prompt"]] * 2)
        assert [v.partial for v in verdicts] == [meta["winner_score"], meta["loser_score"]]


def test_the_same_command_writes_byte_identical_shards_and_never_over_an_old_set(mined, tmp_path):
    tmp, summary = mined
    again = _mine(tmp, "b", "--batch-size", "5")  # another batching: the noise is per sample
    assert again.returncode == 0, again.stderr
    digest = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()  # noqa: E731
    assert [digest(p) for p in json.loads(again.stdout)["shards"]] == [digest(p) for p in summary["shards"]]
    other_seed = _mine(tmp, "c", "--seed", "1")
    assert other_seed.returncode == 0
    assert [digest(p) for p in json.loads(other_seed.stdout)["shards"]] != [digest(p) for p in summary["shards"]]
    refused = _mine(tmp, "a")
    assert refused.returncode == 2 and "already exist" in refused.stderr and "Traceback" not in refused.stderr


def test_the_sampler_flags_replace_the_targets_settings_and_are_recorded(tmp_path):
    done = _mine(tmp_path, "g1", "--sample-steps", "4", "--guidance", "1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sampler"] == {"steps": 4, "shift": 1.0, "guidance": 1.0}
    assert json.loads((tmp_path / "g1" / "mine.json").read_text())["sampler"]["steps"] == 4


@pytest.mark.parametrize("extra, needle", [
    (["--samples", "1"], "--samples: must be >= 2"),
    # A second --reward (beside _mine's shapes_partial) asks for both, weighted: the unknown one is named.
    (["--reward", "nope"], "--reward nope: unknown reward; use a built-in one"),
    (["--sample-steps", "0"], "--sample-steps: must be >= 1"),
    (["--step", "5"], "--step 5: TARGET 'preset:shapes' is a model, which has no checkpoints"),
])  # fmt: skip
def test_bad_options_are_one_line_errors(tmp_path, extra, needle):
    done = _mine(tmp_path, "x", *extra)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()  # refused before anything is written
    assert not (tmp_path / "x").exists()


def test_a_prompt_outside_the_shapes_grammar_names_its_row(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a red circle\na purple hexagon\n")
    done = cosmos("pairs", "mine", "preset:shapes", "--reward", "shapes_strict", "--prompts", bad, "--out", tmp_path / "o")
    assert done.returncode == 2 and "prompt 2" in done.stderr and "Traceback" not in done.stderr
