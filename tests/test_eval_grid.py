"""The labelled sample sheet (`evaluation.grid`): tiles upscaled nearest-neighbour, captions and
verdicts under them, row labels, the same bytes on every call."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cosmos_rl.evaluation.grid import (
    CAPTION_LINES, FAIL_INK, GAP_PX, MIN_TILE_PX, PASS_INK, Tile, save_sheet, scale_of, sheet, verdict_text, wrap,
)  # fmt: skip


def checker(colour: tuple[int, int, int]) -> np.ndarray:
    """32x32: `colour` where (y + x) is even, black elsewhere."""
    y, x = np.mgrid[:32, :32]
    image = np.zeros((32, 32, 3), np.uint8)
    image[(y + x) % 2 == 0] = colour
    return image


def test_verdicts_scales_and_wrapping_follow_the_rules():
    assert verdict_text("shapes_strict", 1.0, 1.0) == ("pass, partial 1.00", True)
    assert verdict_text("shapes_partial", 0.0, 2 / 3) == ("fail, partial 0.67", False)
    assert verdict_text("brightness", 0.41234, None) == ("brightness 0.412", None)
    assert scale_of(32, 32) == 4 and scale_of(100, 200) == 2 and scale_of(256, 256) == 1 and scale_of(9, 5) == 26
    # One unit per character, ten to a line.
    assert wrap("a blue square to the left", 10, len) == ["a blue", "square to", "the left"]
    assert wrap("abcdefghijklmnopqrstuvwxyz", 10, len) == ["abcdefghij", "klmnopqrst", "uvwxyz"]
    cut = wrap(" ".join(["word"] * 20), 10, len)
    assert len(cut) == CAPTION_LINES and cut[-1].endswith("...") and all(len(line) <= 10 for line in cut)
    assert wrap("a\x1b[31m red circle", 40, len) == ["a?[31m red circle"]  # no control characters drawn


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def test_a_sheet_shows_every_tile_upscaled_with_its_labels():
    """Two rows (base, checkpoint) of a red and a blue checker: pure red and pure blue appear only in
    the tiles (the verdict inks are darker), so their runs locate each tile: 32 px x 4 = 128."""
    red, blue = checker((255, 0, 0)), checker((0, 0, 255))
    rows = [
        ("base", [Tile(red, "a red circle", "fail, partial 0.50", False), Tile(blue, "a blue square", "fail, partial 0.00", False)]),
        ("checkpoint\nstep 2", [Tile(red, "a red circle", "pass, partial 1.00", True), Tile(blue, "a blue square", "pass, partial 1.00", True)]),
    ]
    pixels = np.asarray(sheet(rows))
    found = 0
    for colour, image, column in (((255, 0, 0), red, 0), ((0, 0, 255), blue, 1)):
        mask = (pixels == colour).all(axis=2)
        ys, xs = runs(mask.any(axis=1)), runs(mask.any(axis=0))
        # One column of this colour, one run per row; a checker's rows and columns all hold the colour.
        assert len(xs) == 1 and len(ys) == 2 and xs[0][1] - xs[0][0] == MIN_TILE_PX
        left = xs[0][0]
        for r, (top, end) in enumerate(ys):
            assert end - top == MIN_TILE_PX
            block = pixels[top:end, left : left + MIN_TILE_PX]
            assert np.array_equal(block, np.repeat(np.repeat(image, 4, axis=0), 4, axis=1))  # each pixel a 4x4 block
            stop = ys[r + 1][0] if r + 1 < len(ys) else pixels.shape[0]  # the text band, up to the next row
            below = pixels[end:stop, left : left + MIN_TILE_PX]
            assert (below.max(axis=2) < 100).any()  # the caption: dark ink under the tile
            ink = PASS_INK if rows[r][1][column].passed else FAIL_INK
            assert (np.abs(below.astype(int) - ink).sum(axis=2) < 60).any()  # the verdict in its colour
            if column == 0:
                assert (pixels[top:end, GAP_PX : left - GAP_PX].max(axis=2) < 100).any()  # the row's label
            found += 1
    assert found == 4


def test_a_saved_sheet_is_the_same_bytes_every_time_and_bad_rows_are_refused(tmp_path):
    rows = [("model", [Tile(checker((0, 255, 0)), "a green triangle to the left of a red square", "fail, partial 0.33", False)])]
    first, second = save_sheet(tmp_path / "a.png", rows), save_sheet(tmp_path / "b.png", rows)
    assert first.read_bytes() == second.read_bytes()
    with Image.open(io.BytesIO(first.read_bytes())) as image:
        assert image.format == "PNG" and image.height > MIN_TILE_PX
    with pytest.raises(ValueError, match="every row needs 1 uint8 tiles"):
        sheet([*rows, ("other", [Tile(np.zeros((16, 16, 3), np.uint8), "x", "y")])])
    with pytest.raises(ValueError, match="at least one row"):
        sheet([])
