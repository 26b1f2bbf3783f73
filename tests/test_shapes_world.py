"""The shapes world: captions, the train/held-out split, renders, shards and prompt files."""

import json
import shlex
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

from cosmos_rl.data.prompts import load_prompts
from cosmos_rl.core.errors import UserError
from cosmos_rl.shapes import (
    TASKS,
    CaptionError,
    Group,
    Spec,
    all_specs,
    balanced,
    parse_caption,
    render,
    split_prompts,
    task_of,
    write_prompt_file,
    write_shards,
)
from cosmos_rl.shapes.__main__ import _parser, main
from cosmos_rl.shapes.scene import layout

# Counted by hand from the grammar: 3 shapes, 6 colours, counts 2-3, 4 relations.
TASK_SIZES = {
    "single_object": 3,  # shapes
    "colours": 18,  # 6 colours x 3 shapes
    "counting": 42,  # 2 counts x (3 bare + 18 coloured)
    "two_objects": 6,  # ordered pairs of distinct shapes
    "colour_attribution": 270,  # ordered pairs of coloured objects of different colours: 18 x 15
    "position": 1248,  # 4 relations x (3 x 2 bare + 18 x 17 coloured ordered pairs)
}


def test_task_sizes_and_examples():
    assert {task: len(all_specs(task)) for task in TASKS} == TASK_SIZES
    examples = {
        "single_object": "a circle",
        "colours": "a red circle",
        "counting": "two red circles",
        "two_objects": "a circle and a square",
        "colour_attribution": "a red circle and a blue square",
        "position": "a blue square to the left of a yellow triangle",
    }
    for task, caption in examples.items():
        assert caption in {spec.caption() for spec in all_specs(task)}
        assert task_of(caption) == task


def test_every_caption_round_trips_and_is_unique():
    captions = []
    for task in TASKS:
        for spec in all_specs(task):
            assert parse_caption(spec.caption()) == spec
            assert spec.task == task
            assert Spec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
            captions.append(spec.caption())
    assert len(set(captions)) == len(captions)


def test_parser_normalises_case_spaces_and_full_stop():
    assert parse_caption("  Two  RED circles. ") == Spec((Group("circle", "red", 2),))
    assert parse_caption("a square below a blue triangle") == Spec((Group("square"), Group("triangle", "blue")), "below")


@pytest.mark.parametrize("caption, message", [
    ("", "it is empty"),
    ("a orange circle", "'orange' is not a colour of the shapes world"),
    ("a big red circle", "should be a count, an optional colour and a shape"),
    ("four circles", "should start with one of 'a', 'two', 'three'"),
    ("a circles", "singular after 'a'"),
    ("two circle", "plural after a count"),
    ("a hexagon", "'hexagon' is not a shape"),
    ("a circle left of a square", "should be a count, an optional colour and a shape"),
    ("two circles to the left of a square", "relates two single objects"),
    ("a circle and a square and a triangle", "more than two phrases"),
    ("three circles and a square", "more than 3 objects"),
    ("a photo of a cat", "should be a count"),
])
def test_parser_refuses_what_it_cannot_read(caption, message):
    with pytest.raises(CaptionError, match=message) as info:
        parse_caption(caption)
    assert repr(caption) in str(info.value)  # the error quotes the caption
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def test_split_is_disjoint_complete_and_seeded():
    split = split_prompts(seed=0)
    for task in TASKS:
        train, held = split.train[task], split.held_out[task]
        assert train and held
        assert sorted(s.caption() for s in train + held) == sorted(s.caption() for s in all_specs(task))
        # No held-out prompt is a rewording ("B right of A") of a training prompt.
        assert not {s.canonical() for s in train} & {s.canonical() for s in held}
    assert not set(split.train_captions()) & set(split.held_out_captions())
    # round(0.2 * canonical specs), at least one: 3 -> 1, 3 -> 1, 18 -> 4, 42 -> 8, 135 -> 27, 624 -> 125
    canonical_held = {task: len({s.canonical() for s in split.held_out[task]}) for task in TASKS}
    assert canonical_held == {"single_object": 1, "two_objects": 1, "colours": 4, "counting": 8,
                              "colour_attribution": 27, "position": 125}
    assert split_prompts(seed=0) == split
    assert split_prompts(seed=1).held_out_captions() != split.held_out_captions()


def test_balanced_gives_every_task_the_same_share():
    split = split_prompts(seed=0)
    drawn = balanced(split.train, 60, seed=3)
    assert [spec.task for spec in drawn[:6]] == list(TASKS)
    assert {task: sum(s.task == task for s in drawn) for task in TASKS} == dict.fromkeys(TASKS, 10)
    assert all(spec in split.train[spec.task] for spec in drawn)
    # single_object has 2 training specs: 10 draws cycle through both 5 times
    singles = [s.caption() for s in drawn if s.task == "single_object"]
    assert sorted(set(singles)) == sorted(s.caption() for s in split.train["single_object"])
    assert balanced(split.train, 60, seed=3) == drawn


def test_render_is_deterministic_and_draws_what_the_layout_says():
    spec = parse_caption("a blue square to the left of a yellow triangle")
    image = render(spec, seed=5)
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert np.array_equal(render(spec, seed=5), image)
    assert not np.array_equal(render(spec, seed=6), image)
    square, triangle = layout(spec, seed=5)
    assert (square.shape, square.colour, triangle.shape, triangle.colour) == ("square", "blue", "triangle", "yellow")
    # Only black, blue and yellow pixels, and the square's centre pixel is blue.
    colours = {tuple(p) for p in image.reshape(-1, 3)}
    assert colours == {(0, 0, 0), (0, 0, 255), (255, 255, 0)}
    assert tuple(image[int(square.cy), int(square.cx)]) == (0, 0, 255)
    assert render(spec, seed=5, size=(48, 64)).shape == (48, 64, 3)
    with pytest.raises(ValueError, match="at least 32 px"):
        render(spec, seed=5, size=16)


def test_uncoloured_groups_get_seeded_palette_colours():
    spec = parse_caption("three circles")
    colours = {obj.colour for seed in range(20) for obj in layout(spec, seed)}
    assert len(colours) > 1


def test_shards_are_readable_by_webdataset_and_reproducible(tmp_path):
    specs = balanced(split_prompts(seed=0).train, 7, seed=0)
    paths = write_shards(tmp_path / "a", specs, seed=11, per_shard=3)
    assert [p.name for p in paths] == ["shapes-000000.tar", "shapes-000001.tar", "shapes-000002.tar"]
    samples = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False).decode("rgb8"))
    assert [s["__key__"] for s in samples] == [f"{i:08d}" for i in range(7)]
    for sample, spec in zip(samples, specs):
        meta = sample["json"]
        assert sample["txt"] == spec.caption() == meta["caption"]
        assert meta["task"] == spec.task and Spec.from_dict(meta["spec"]) == spec
        assert np.array_equal(sample["png"], render(spec, meta["seed"], tuple(meta["size"])))
    again = write_shards(tmp_path / "b", specs, seed=11, per_shard=3)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths]
    with tarfile.open(paths[0]) as tar:
        assert {m.mtime for m in tar.getmembers()} == {0}
    with pytest.raises(UserError, match="already exist"):
        write_shards(tmp_path / "a", specs, seed=11)


def test_prompt_files_read_back_with_the_project_loader(tmp_path):
    held = split_prompts(seed=0).held_out_captions()
    for name in ("held.txt", "held.jsonl"):
        path = write_prompt_file(tmp_path / name, held)
        assert load_prompts(path) == held
    row = json.loads((tmp_path / "held.jsonl").read_text().splitlines()[0])
    assert row["task"] == task_of(row["prompt"]) and Spec.from_dict(row["spec"]).caption() == row["prompt"]
    with pytest.raises(UserError, match="must end in .txt"):
        write_prompt_file(tmp_path / "held.csv", held)
    with pytest.raises(CaptionError):
        write_prompt_file(tmp_path / "bad.txt", ["a cat"])


def test_command_line_writes_prompts_and_shards(tmp_path, capsys):
    assert main(["prompts", str(tmp_path / "p"), "--seed", "2"]) == 0
    split = split_prompts(seed=2)
    assert load_prompts(tmp_path / "p" / "train.txt") == split.train_captions()
    assert load_prompts(tmp_path / "p" / "held_out.jsonl") == split.held_out_captions()
    assert main(["prompts", str(tmp_path / "q"), "--balanced", "12"]) == 0
    assert len(load_prompts(tmp_path / "q" / "train.txt")) == 12
    assert main(["shards", str(tmp_path / "s"), "--samples", "5", "--per-shard", "2"]) == 0
    assert len(list((tmp_path / "s").glob("shapes-*.tar"))) == 3
    assert main(["shards", str(tmp_path / "s"), "--samples", "5"]) == 2
    assert "already exist" in capsys.readouterr().err


def test_commands_quoted_in_the_docs_parse():
    """Every `python -m cosmos_rl.shapes ...` line of the README and docs/ (the shapes page writes the
    prompt files and shards; the algorithm and video pages write their data the same way)."""
    root = Path(__file__).resolve().parent.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    lines = [(page.name, line.partition("  #")[0]) for page in pages for line in page.read_text().splitlines()
             if line.startswith("python -m cosmos_rl.shapes ")]
    assert {"shapes.md", "sft.md", "video.md", "results.md"} <= {name for name, _ in lines}
    for _, line in lines:
        _parser().parse_args(shlex.split(line)[3:])  # exits (SystemExit) on a stale option
