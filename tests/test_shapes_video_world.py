"""The moving-shapes world: video captions, the train/held-out split, ground-truth clips, prompt files."""

import json

import numpy as np
import pytest

from cosmos_rl.data.prompts import load_prompts
from cosmos_rl.core.errors import UserError
from cosmos_rl.shapes import CaptionError, Group, Spec, parse_caption
from cosmos_rl.shapes.clips import EDGE, MIN_FRAMES, Mover, clip_layout, draw_clip, render_clip
from cosmos_rl.shapes.motion_caption import motion_task_of, parse_motion_caption
from cosmos_rl.shapes.motion_spec import DIRECTIONS, MOTION_TASKS, Clause, MotionSpec
from cosmos_rl.shapes.motion_world import (
    all_motion_specs, balanced_motion, split_motion_prompts, words_of, write_motion_prompt_file,
)
from cosmos_rl.shapes.spec import COLOURS, SHAPES

# Counted by hand: 3 shapes, 6 colours, 4 directions; an object is one of 3 bare + 18 coloured = 21;
# ordered pairs told apart: 3 x 2 bare + 18 x 15 coloured (different colours) = 276.
TASK_SIZES = {
    "motion": 84,  # 21 objects x 4 directions
    "two_motions": 3312,  # 276 pairs x 12 ordered pairs of different directions
    "static": 2505,  # 21 still objects + 276 pairs x 9 (still+still, still+4, 4+still)
    "colour_change": 90,  # 3 shapes x 6 x 5 ordered colour pairs
    "counting_motion": 168,  # 2 counts x 21 x 4
    "turn": 252,  # 21 x 12
}
# Meanings: one per caption, except that "A and B" and "B and A" mean the same:
# two_motions 3312 / 2; static 21 + 2484 / 2.
MEANINGS = {"motion": 84, "two_motions": 1656, "static": 1263, "colour_change": 90, "counting_motion": 168, "turn": 252}


@pytest.fixture(scope="module")
def split():
    return split_motion_prompts(seed=0)


def test_task_sizes_and_examples():
    assert {task: len(all_motion_specs(task)) for task in MOTION_TASKS} == TASK_SIZES
    assert {task: len({s.canonical() for s in all_motion_specs(task)}) for task in MOTION_TASKS} == MEANINGS
    examples = {
        "motion": "a red circle moving left",
        "two_motions": "a circle moving up and a square moving left",
        "static": "a red square staying still and a blue triangle moving down",
        "colour_change": "a square turning from red to blue",
        "counting_motion": "three blue triangles moving down",
        "turn": "a circle moving left then up",
    }
    for task, caption in examples.items():
        assert caption in {spec.caption() for spec in all_motion_specs(task)}
        assert motion_task_of(caption) == task
    assert motion_task_of("a green circle staying still") == "static"


def test_every_caption_round_trips_and_is_unique():
    captions = []
    for task in MOTION_TASKS:
        for spec in all_motion_specs(task):
            assert parse_motion_caption(spec.caption()) == spec and spec.task == task
            assert MotionSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
            captions.append(spec.caption())
    assert len(set(captions)) == len(captions)


def test_parser_normalises_case_spaces_and_full_stop():
    two_red = MotionSpec((Clause(Group("circle", "red", 2), "move", ("left",)),))
    assert parse_motion_caption("  Two  RED circles Moving left. ") == two_red
    change = parse_motion_caption("a square turning from red to blue").clauses[0]
    assert change == Clause(Group("square"), "change", ("red", "blue"))


@pytest.mark.parametrize("caption, message", [
    ("", "it is empty"),
    ("a red circle", "does not say what the object does"),
    ("a circle to the left of a square", "does not say what the object does"),
    ("a orange circle moving left", "'orange' is not a colour of the shapes world"),
    ("a big red circle moving left", "should be a count, an optional colour and a shape"),
    ("four circles moving left", "should start with one of 'a', 'two', 'three'"),
    ("a circles moving left", "singular after 'a'"),
    ("two circle moving left", "plural after a count"),
    ("a circle moving sideways", "should be 'moving' and a direction"),
    ("a circle moving left then left", "a turn needs two different directions"),
    ("a circle staying", "should be 'staying still'"),
    ("a square turning from red to orange", "should be 'turning from' a colour 'to' another"),
    ("a square turning from red to red", "two different colours"),
    ("a red square turning from red to blue", "names its colours in 'turning from ... to ...' only"),
    ("two circles staying still", "can only move, all one way"),
    ("a circle moving left and a circle moving right", "must be different shapes"),
    ("a red circle moving left and a square moving up", "both name a colour or neither"),
    ("a red circle moving left and a red square moving up", "must have different colours"),
    ("a circle moving left and a square moving left", "go different ways"),
    ("two circles moving left and a square moving up", "two clauses are single objects"),
    ("a circle moving left then up and a square staying still", "two clauses are single objects"),
    ("a circle moving up and a square moving left and a triangle staying still", "more than two clauses"),
])
def test_parser_refuses_what_it_cannot_read(caption, message):
    with pytest.raises(CaptionError, match=message) as info:
        parse_motion_caption(caption)
    assert repr(caption) in str(info.value)
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def test_parser_accepts_exactly_the_enumerated_captions():
    """Random word salads of the world's words: each accepted one is a caption of some task."""
    every = {spec.caption() for task in MOTION_TASKS for spec in all_motion_specs(task)}
    rng = np.random.default_rng(0)
    counts, colours, shapes = ["a", "two", "three", "four"], [None, *COLOURS, "orange"], [*SHAPES, "hexagon"]
    actions = ["moving left", "moving up", "moving left then down", "moving up then up", "staying still",
               "turning from red to blue", "turning from cyan to cyan", "moving", "still"]
    accepted = 0
    for _ in range(3000):
        clauses = []
        for _ in range(rng.choice([1, 2, 2, 3], p=[0.45, 0.25, 0.25, 0.05])):
            count, colour = rng.choice(counts), colours[rng.integers(len(colours))]
            shape = shapes[rng.integers(len(shapes))] + ("s" if count != "a" else "")
            clauses.append(" ".join(w for w in (count, colour, shape, rng.choice(actions)) if w))
        caption = " and ".join(clauses)
        try:
            spec = parse_motion_caption(caption)
        except CaptionError:
            assert caption not in every
            continue
        accepted += 1
        assert spec.caption() == caption and caption in every
    assert accepted > 150


def test_split_is_disjoint_complete_and_seeded(split):
    for task in MOTION_TASKS:
        train, held = split.train[task], split.held_out[task]
        assert sorted(s.caption() for s in train + held) == sorted(s.caption() for s in all_motion_specs(task))
        # 40 meanings held out; no held-out prompt is a reordering of a training one
        assert len({s.canonical() for s in held}) == 40
        assert not {s.canonical() for s in train} & {s.canonical() for s in held}
        assert set().union(*map(words_of, train)) == set().union(*map(words_of, all_motion_specs(task)))
    sizes = {task: len(split.held_out[task]) for task in MOTION_TASKS}
    # one caption per meaning in the one-clause tasks, two for two_motions ("A and B", "B and A")
    assert {t: sizes[t] for t in ("motion", "colour_change", "counting_motion", "turn")} == dict.fromkeys(
        ("motion", "colour_change", "counting_motion", "turn"), 40)
    assert sizes["two_motions"] == 80 and 40 <= sizes["static"] <= 80
    assert not set(split.train_captions()) & set(split.held_out_captions())
    assert split_motion_prompts(seed=0) == split
    assert split_motion_prompts(seed=1).held_out_captions() != split.held_out_captions()
    with pytest.raises(ValueError, match="cannot hold out 84"):
        split_motion_prompts(seed=0, per_task=84)


def test_every_video_caption_has_an_image_world_frame_caption():
    for task in MOTION_TASKS:
        for spec in all_motion_specs(task)[::5]:
            if task == "colour_change":
                assert spec.frame_caption() is None and spec.frame_spec() is None
                continue
            assert parse_caption(spec.frame_caption()) == spec.frame_spec()
    assert parse_motion_caption("two red circles moving up").frame_spec() == Spec((Group("circle", "red", 2),))
    assert parse_motion_caption("a circle staying still and a square moving left").frame_caption() == "a circle and a square"


def test_balanced_draws_the_tasks_in_turn(split):
    drawn = balanced_motion(split.train, 60, seed=3)
    assert [spec.task for spec in drawn[:6]] == list(MOTION_TASKS)
    assert {task: sum(s.task == task for s in drawn) for task in MOTION_TASKS} == dict.fromkeys(MOTION_TASKS, 10)
    assert all(spec in split.train[spec.task] for spec in drawn)
    assert balanced_motion(split.train, 60, seed=3) == drawn


def _inside_and_apart(movers: list[Mover], size: int = 32) -> bool:
    for t in range(len(movers[0].centres)):
        boxes = [m.at(t) for m in movers]
        if any(o.cx - o.h < EDGE or o.cx + o.h > size - EDGE or o.cy - o.h < EDGE or o.cy + o.h > size - EDGE for o in boxes):
            return False
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                if abs(a.cx - b.cx) < a.h + b.h + 2 and abs(a.cy - b.cy) < a.h + b.h + 2:
                    return False
    return True


def test_clips_are_deterministic_straight_and_inside_the_frame():
    clip = render_clip("a red circle moving left", seed=5)
    assert clip.shape == (9, 32, 32, 3) and clip.dtype == np.uint8
    assert np.array_equal(render_clip("a red circle moving left", seed=5), clip)
    assert not np.array_equal(render_clip("a red circle moving left", seed=6), clip)
    assert render_clip("a circle moving up", 0, size=(48, 64), frames=5).shape == (5, 48, 64, 3)
    with pytest.raises(ValueError, match=f"at least {MIN_FRAMES} frames"):
        render_clip("a circle moving up", 0, frames=2)
    for task in MOTION_TASKS:
        for spec in all_motion_specs(task)[::53]:
            for seed in range(2):
                movers = clip_layout(spec, seed)
                assert _inside_and_apart(movers), (spec.caption(), seed)
    # A move is a straight line at constant speed, a whole number of pixels (9-12 at 32) to the left.
    (circle,) = clip_layout(parse_motion_caption("a red circle moving left"), seed=5)
    xs, ys = np.array(circle.centres).T
    assert np.allclose(np.diff(xs), np.diff(xs)[0]) and np.all(ys == ys[0]) and circle.colours == ("red",) * 9
    assert xs[0] - xs[-1] in range(9, 13)
    # A formation of three shares one velocity and travels 9 px; a colour change switches at frame 9 // 2.
    three = clip_layout(parse_motion_caption("three squares moving down"), seed=1)
    assert {round(m.centres[-1][1] - m.centres[0][1], 9) for m in three} == {9.0}
    (square,) = clip_layout(parse_motion_caption("a square turning from red to blue"), seed=0)
    assert square.colours == ("red",) * 4 + ("blue",) * 5 and len(set(square.centres)) == 1
    # A turn: left up to frame 4, then up.
    (turn,) = clip_layout(parse_motion_caption("a circle moving left then up"), seed=2)
    steps = np.diff(np.array(turn.centres), axis=0)
    assert np.all(steps[:4, 0] < 0) and np.all(steps[:4, 1] == 0) and np.all(steps[4:, 0] == 0) and np.all(steps[4:, 1] < 0)


def test_draw_clip_draws_each_frame_with_the_image_renderer():
    movers = clip_layout(parse_motion_caption("a blue square staying still and a yellow triangle moving up"), seed=4)
    clip = draw_clip(movers)
    assert {tuple(p) for p in clip.reshape(-1, 3)} == {(0, 0, 0), (0, 0, 255), (255, 255, 0)}
    square = movers[0].at(0)
    assert all(tuple(frame[int(square.cy), int(square.cx)]) == (0, 0, 255) for frame in clip)
    assert set(DIRECTIONS) == {"left", "right", "up", "down"}


def test_prompt_files_read_back_with_the_project_loader(tmp_path, split):
    held = split.held_out_captions()
    for name in ("held.txt", "held.jsonl"):
        path = write_motion_prompt_file(tmp_path / name, held)
        assert load_prompts(path) == held
    rows = [json.loads(line) for line in (tmp_path / "held.jsonl").read_text().splitlines()]
    for row in rows:
        spec = MotionSpec.from_dict(row["spec"])
        assert spec.caption() == row["prompt"] and row["task"] == spec.task and row["frame_caption"] == spec.frame_caption()
    with pytest.raises(UserError, match="must end in .txt"):
        write_motion_prompt_file(tmp_path / "held.csv", held)
    with pytest.raises(CaptionError):
        write_motion_prompt_file(tmp_path / "bad.txt", ["a red circle"])
