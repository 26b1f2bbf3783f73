"""The shapes verifier: exact on ground truth, the right fraction on perturbed renders, robust to a
little noise and blur, and registered as built-in rewards."""

from dataclasses import replace

import numpy as np
import pytest

from cosmos_rl.config.preflight.rewards import builtin_rewards as preflight_builtin
from cosmos_rl.rewards.registry import builtin_rewards
from cosmos_rl.shapes import (
    TASKS,
    CaptionError,
    all_specs,
    overall_score,
    parse_caption,
    render,
    scores_by_task,
    shapes_partial,
    shapes_strict,
    verify,
)
from cosmos_rl.shapes.analyse import Found, classify, detect, segment
from cosmos_rl.shapes.components import components, label
from cosmos_rl.shapes.scene import Placed, draw, layout
from cosmos_rl.shapes.spec import relation_holds
from cosmos_rl.shapes.verifier import judge


def _sample(task: str, n: int) -> list:
    specs = all_specs(task)
    return [specs[i] for i in np.random.default_rng(0).permutation(len(specs))[:n]]


def _truth(specs, seeds):
    captions = [spec.caption() for seed in seeds for spec in specs]
    return np.stack([render(spec, seed) for seed in seeds for spec in specs]), captions


# ------------------------------------------------------------------------ pieces, by hand
def test_label_splits_same_class_pixels_that_do_not_touch():
    classes = np.array([[[1, 1, 0, 2, 2]], [[1, 2, 2, 1, 1]]])
    assert label(classes).tolist() == [[[0, 0, -1, 3, 3]], [[5, 6, 6, 8, 8]]]
    # A U shape: the two arms meet only through the bottom row.
    u = np.array([[[1, 0, 1], [1, 0, 1], [1, 1, 1]]])
    assert len(set(label(u)[u > 0].tolist())) == 1


def test_component_statistics():
    """A 2x2 block at x 3-4, y 1-2: area 4, centroid (4, 2), reach 1 on axes, sqrt 2 on diagonals."""
    classes = np.zeros((1, 5, 6), int)
    classes[0, 1:3, 3:5] = 4
    parts = components(classes)
    assert len(parts) == 1 and parts.klass.tolist() == [4] and parts.area.tolist() == [4]
    assert (parts.cx[0], parts.cy[0]) == (4.0, 2.0)
    assert (parts.x0[0], parts.x1[0], parts.y0[0], parts.y1[0]) == (3, 4, 1, 2)
    assert parts.reach[0] == pytest.approx([1, 1, 1, 1] + [np.sqrt(2)] * 4)


def test_segment_by_channel_tolerance():
    pixels = np.array([[[[250, 30, 5], [255, 128, 0], [255, 255, 255], [20, 0, 90], [200, 230, 10]]]], np.uint8)
    # red; orange (green 128 from both ends); white (not a world colour); black; yellow
    assert segment(pixels).tolist() == [[[1, -1, -1, 0, 4]]]


def test_classify_table():
    got = classify(np.array([1.0, 0.78, 0.5, 0.5, 0.5, 1.0]), np.array([1.41, 1.0, 1.1, 0.71, 1.1, 1.41]),
                   np.array([1.0, 1.0, 2.0, 1.0, 0.5, 1.0]), np.array([1.0, 1.0, 1.0, 1.0, 1.0, 4.0]))
    assert got == ["square", "circle", "triangle", "other", "other", "other"]


def test_relation_rule():
    """32x32, margin 3.2 px: 12 px to the right and 2 down is "left of"; 12 right and 16 down is "above"."""
    assert relation_holds((8, 16), (20, 18), "left of", 32, 32)
    assert relation_holds((20, 18), (8, 16), "right of", 32, 32)
    assert not relation_holds((8, 4), (20, 20), "left of", 32, 32)
    assert relation_holds((8, 4), (20, 20), "above", 32, 32)
    assert not relation_holds((8, 16), (11, 16), "left of", 32, 32)  # 3 px < margin


def test_detect_sees_each_rendered_object():
    spec = parse_caption("a red circle to the left of a blue triangle")
    placed = layout(spec, seed=0)
    (found,) = detect(render(spec, seed=0)[None])
    assert sorted((f.colour, f.shape) for f in found) == [("blue", "triangle"), ("red", "circle")]
    by_shape = {f.shape: f for f in found}
    for obj in placed:
        assert (by_shape[obj.shape].x, by_shape[obj.shape].y) == pytest.approx(obj.centroid, abs=0.6)


def test_judge_worked_examples():
    """The module docstring's examples, on hand-made detections."""
    def found(*objs):
        return [Found(c, s, x, y, 50) for c, s, x, y in objs]
    three_red = found(("red", "circle", 5, 5), ("red", "circle", 15, 5), ("red", "circle", 25, 5))
    v = judge(parse_caption("two red circles"), three_red, 32, 32)
    assert (v.met, v.total, v.strict) == (2, 3, 0.0)
    v = judge(parse_caption("a red circle"), found(("blue", "circle", 5, 5)), 32, 32)
    assert (v.met, v.total) == (0, 2)
    swapped = found(("blue", "square", 25, 16), ("yellow", "triangle", 5, 16))
    v = judge(parse_caption("a blue square to the left of a yellow triangle"), swapped, 32, 32)
    assert (v.met, v.total) == (2, 3) and v.failures == ("relation 'left of' does not hold",)
    v = judge(parse_caption("a circle and a red circle"), found(("red", "circle", 5, 5), ("blue", "circle", 25, 5)), 32, 32)
    assert (v.met, v.total) == (2, 2)  # the red one goes to "a red circle", the blue one to "a circle"


# ------------------------------------------------------------------ ground truth scores 1
@pytest.mark.parametrize("task", TASKS)
def test_ground_truth_scores_one_on_every_task(task):
    specs = all_specs(task) if task != "position" else _sample(task, 400)
    images, captions = _truth(specs, seeds=range(3) if len(specs) < 100 else range(2))
    verdicts = verify(images, captions)
    assert [v.failures for v in verdicts if v.strict < 1] == []
    assert shapes_strict(images, captions) == [1.0] * len(captions)
    assert shapes_partial(images, captions) == [1.0] * len(captions)


def test_ground_truth_scores_one_over_many_seeds_and_sizes():
    specs = [spec for task in TASKS for spec in _sample(task, 4)]
    images, captions = _truth(specs, seeds=range(100, 125))
    assert shapes_strict(images, captions) == [1.0] * len(captions)
    for size in ((64, 64), (48, 64)):
        big = np.stack([render(spec, 7, size) for spec in specs])
        assert shapes_strict(big, [s.caption() for s in specs]) == [1.0] * len(specs)


def _blur(images: np.ndarray, sigma: float) -> np.ndarray:
    taps = np.exp(-0.5 * (np.arange(-2, 3) / sigma) ** 2)
    taps /= taps.sum()
    x = images.astype(np.float64)
    h, w = x.shape[1:3]
    padded = np.pad(x, ((0, 0), (2, 2), (0, 0), (0, 0)), mode="edge")
    x = sum(t * padded[:, i:i + h] for i, t in enumerate(taps))
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (0, 0)), mode="edge")
    return sum(t * padded[:, :, i:i + w] for i, t in enumerate(taps))


def test_a_little_noise_and_blur_change_nothing():
    specs = [spec for task in TASKS for spec in _sample(task, 40)]
    images, captions = _truth(specs, seeds=range(3))
    rng = np.random.default_rng(0)
    noisy = np.clip(np.rint(images + rng.normal(0, 8, images.shape)), 0, 255).astype(np.uint8)
    blurred = np.clip(np.rint(_blur(images, 0.6)), 0, 255).astype(np.uint8)
    both = np.clip(np.rint(_blur(images, 0.6) + rng.normal(0, 8, images.shape)), 0, 255).astype(np.uint8)
    for batch in (noisy, blurred, both):
        assert [v.failures for v in verify(batch, captions) if v.strict < 1] == []


# ------------------------------------------------------------------------- perturbations
def _free_spot(objects: list[Placed], h: float = 5.5, size: int = 32) -> tuple[float, float]:
    """A box centre where a new object of half-size h touches nothing (grid scan, deterministic)."""
    for cy in np.arange(h + 1, size - h - 1, 0.5):
        for cx in np.arange(h + 1, size - h - 1, 0.5):
            if all(abs(cx - o.cx) >= o.h + h + 2 or abs(cy - o.cy) >= o.h + h + 2 for o in objects):
                return float(cx), float(cy)
    raise AssertionError("no free spot")


def _scores(caption: str, perturb, seeds=range(12)):
    """(strict, partial) of each seed's render after ``perturb(list_of_placed) -> list_of_placed``."""
    spec = parse_caption(caption)
    images = []
    for seed in seeds:
        placed = perturb(layout(spec, seed))
        if placed is None:
            continue
        images.append(draw(placed))
    batch = np.stack(images)
    return shapes_strict(batch, [caption] * len(images)), shapes_partial(batch, [caption] * len(images))


def _recolour(index, colour):
    return lambda placed: [replace(o, colour=colour) if i == index else o for i, o in enumerate(placed)]


def _reshape(index, shape):
    return lambda placed: [replace(o, shape=shape) if i == index else o for i, o in enumerate(placed)]


def _drop(index):
    return lambda placed: [o for i, o in enumerate(placed) if i != index]


def _add(shape, colour):
    def add(placed):
        try:
            cx, cy = _free_spot(placed)
        except AssertionError:
            return None  # the layout is too full for a fourth object at this seed
        return placed + [Placed(shape, colour, cx, cy, 5.5)]
    return add


def _swap(placed):
    a, b = placed
    return [replace(a, shape=b.shape, colour=b.colour), replace(b, shape=a.shape, colour=a.colour)]


@pytest.mark.parametrize("caption, perturb, partial", [
    # wrong colour: the requested object is missing and the recoloured one is extra
    ("a red circle", _recolour(0, "blue"), 0 / 2),
    ("two red circles", _recolour(1, "green"), 1 / 3),
    ("a red circle and a blue square", _recolour(1, "cyan"), 1 / 3),
    ("a blue square to the left of a yellow triangle", _recolour(0, "green"), 1 / 4),  # square, relation, extra
    # missing object
    ("three squares", _drop(2), 2 / 3),
    ("a circle and a triangle", _drop(0), 1 / 2),
    ("a red square above a triangle", _drop(1), 1 / 3),  # the triangle and the relation fail
    # extra object
    ("two red circles", _add("circle", "red"), 2 / 3),
    ("a square", _add("triangle", "magenta"), 1 / 2),
    ("a cyan circle below a red square", _add("circle", "cyan"), 3 / 4),
    # swapped positions: both objects are there, the relation is not
    ("a blue square to the left of a yellow triangle", _swap, 2 / 3),
    ("a red circle above a green circle", _swap, 2 / 3),
    # wrong shape
    ("a red circle", _reshape(0, "square"), 0 / 2),
    ("a red circle and a blue square", _reshape(0, "triangle"), 1 / 3),
    ("three green triangles", _reshape(0, "circle"), 2 / 4),
])
def test_perturbed_renders_fail_strict_and_score_the_right_fraction(caption, perturb, partial):
    strict, partials = _scores(caption, perturb)
    assert len(strict) >= 8
    assert strict == [0.0] * len(strict)
    assert partials == pytest.approx([partial] * len(partials))


def test_blob_spam_is_not_rewarded():
    """Every palette colour as a square and a circle: the 1 requested object is met, 11 are extra."""
    objects = [Placed(shape, colour, 4.5 + 8 * (i % 4), 4.5 + 8 * (i // 4), 3.5)
               for i, (shape, colour) in enumerate((s, c) for s in ("square", "circle")
                                                   for c in ("red", "green", "blue", "yellow", "cyan", "magenta"))]
    image = draw(objects, (32, 32))
    found = detect(image[None])[0]
    assert len(found) == 12
    assert shapes_partial(image[None], ["a red square"]) == [pytest.approx(1 / 12)]
    assert shapes_strict(image[None], ["a red square"]) == [0.0]


def test_empty_and_noise_images():
    noise = np.random.default_rng(0).integers(0, 256, size=(2, 32, 32, 3), dtype=np.uint8)
    empty = np.zeros((1, 32, 32, 3), np.uint8)
    assert shapes_partial(empty, ["two circles"]) == [0.0]
    assert shapes_strict(noise, ["a circle", "a red square"]) == [0.0, 0.0]


# ------------------------------------------------------------------- rewards and tasks
def test_registered_as_built_in_rewards():
    served = builtin_rewards()  # the shapes suite's rewards, registered through the suite
    assert set(preflight_builtin()) == set(served)  # preflight accepts exactly what the service serves
    images, captions = _truth(all_specs("colours")[:3], seeds=[0])
    assert served["shapes_strict"].fn(images, captions) == [1.0, 1.0, 1.0] == shapes_strict(images, captions)
    perturbed = images.copy()
    perturbed[:, :16] = 0  # the left half blacked out: objects lost, partial credit below 1 somewhere
    assert served["shapes_partial"].fn(perturbed, captions) == shapes_partial(perturbed, captions)
    assert served["shapes_strict"].fn(perturbed, captions) == shapes_strict(perturbed, captions)


def test_bad_input_is_refused_before_any_work():
    images = np.zeros((2, 32, 32, 3), np.uint8)
    with pytest.raises(CaptionError, match="'a cat'"):
        shapes_strict(images, ["a circle", "a cat"])
    with pytest.raises(ValueError, match="2 images but 1 captions"):
        shapes_partial(images, ["a circle"])
    with pytest.raises(ValueError, match="uint8"):
        shapes_partial(images.astype(np.float32), ["a circle", "a circle"])
    with pytest.raises(ValueError, match="at least 32 px"):
        shapes_partial(np.zeros((1, 16, 16, 3), np.uint8), ["a circle"])


def test_scores_by_task_and_overall():
    captions = ["a circle", "a square", "two circles", "a red circle to the left of a square"]
    assert scores_by_task(captions, [1, 0, 1, 0.5]) == {"single_object": 0.5, "counting": 1.0, "position": 0.5}
    assert overall_score({"single_object": 0.5, "counting": 1.0, "position": 0.5}) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="2 captions but 1 scores"):
        scores_by_task(captions[:2], [1])
