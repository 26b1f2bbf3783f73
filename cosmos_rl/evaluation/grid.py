"""Sample sheets a person can read: labelled rows of tiles, each tile an image upscaled to a
viewable size with its caption and the verifier's verdict under it. Torch-free.

A sheet is rows of `Tile`s (one row per model: the base above the checkpoint), each row named in
a column on the left. A tile's image is upscaled by a whole factor, nearest-neighbour (a 32 px
sample becomes 128 px, every pixel a 4x4 block: nothing is smoothed that the model did not draw),
so that its shorter side is at least `MIN_TILE_PX`. Text uses Pillow's built-in default font.

The unit is one image per tile, so clips reuse it frame by frame: a frame strip is a row whose
tiles are a clip's frames, and an animated GIF is one sheet per frame index (`sheet` of the
same rows with each tile's frame `t`), all of the same size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

MIN_TILE_PX = 128  # the shorter side of an upscaled tile, at least
GAP_PX = 6  # between tiles, rows and the label column
PAD_PX = 4  # around text
CAPTION_LINES = 4  # a longer caption is cut, ending in "..."
FONT_PX = 12  # Pillow's built-in default font (no font file) at this size
BACKGROUND, INK = (255, 255, 255), (0, 0, 0)
PASS_INK, FAIL_INK = (0, 120, 0), (180, 0, 0)


@dataclass(frozen=True)
class Tile:
    image: np.ndarray  # uint8 [H, W, 3] (a clip's tiles: `clip_strips`, `save_clip_gif`)
    caption: str
    verdict: str  # e.g. verdict_text(...): "pass, partial 1.00"
    passed: bool | None = None  # colours the verdict: green, red, or ink when the reward has no pass/fail


def verdict_text(reward: str, score: float, partial: float | None) -> tuple[str, bool | None]:
    """(the line under a tile, passed or None): the verifier's strict verdict with its partial
    fraction, or another reward's value."""
    if partial is not None:
        passed = score >= 1.0
        return f"{'pass' if passed else 'fail'}, partial {partial:.2f}", passed
    return f"{reward} {score:.3f}", None


def _font():
    return ImageFont.load_default(size=FONT_PX)


def _printable(text: str) -> str:
    # Captions come from prompt files: draw what is there, but no control characters.
    return "".join(c if c.isprintable() else "?" for c in text)


def wrap(text: str, width: float, measure, lines: int = CAPTION_LINES) -> list[str]:
    """Greedy word wrap to `width` pixels (`measure(text)` gives a width), at most `lines` lines; a
    word wider than a line is split; a cut text ends in "..."."""
    out: list[str] = []
    current = ""
    for word in _printable(text).split():
        candidate = f"{current} {word}" if current else word
        if measure(candidate) <= width:
            current = candidate
            continue
        if current:
            out.append(current)
        while measure(word) > width and len(word) > 1:
            cut = 1
            while cut < len(word) and measure(word[: cut + 1]) <= width:
                cut += 1
            out.append(word[:cut])
            word = word[cut:]
        current = word
    if current:
        out.append(current)
    if len(out) > lines:
        last = out[lines - 1]
        while last and measure(last + "...") > width:
            last = last[:-1]
        out = out[: lines - 1] + [last + "..."]
    return out


def scale_of(height: int, width: int) -> int:
    """The whole upscaling factor that brings the shorter side to at least MIN_TILE_PX (1 if it is)."""
    return max(1, math.ceil(MIN_TILE_PX / min(height, width)))


def sheet(rows: Sequence[tuple[str, Sequence[Tile]]]) -> Image.Image:
    """One RGB image: a row per (label, tiles), every row the same number of same-sized tiles; a
    label's lines are split at "\n"."""
    if not rows or not rows[0][1]:
        raise ValueError("a sheet needs at least one row of at least one tile")
    shape = rows[0][1][0].image.shape
    for label, tiles in rows:
        if len(tiles) != len(rows[0][1]) or any(t.image.shape != shape or t.image.dtype != np.uint8 for t in tiles):
            raise ValueError(f"row {label!r}: every row needs {len(rows[0][1])} uint8 tiles of shape {shape}")
    height, width = shape[0], shape[1]
    scale = scale_of(height, width)
    tile_w, tile_h = width * scale, height * scale
    font = _font()
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))

    def measure(text: str) -> float:
        return draw.textlength(text, font=font)

    line_h = font.getbbox("Ag")[3] + 3
    captions = [[wrap(t.caption, tile_w - 2 * PAD_PX, measure) for t in tiles] for _, tiles in rows]
    text_lines = max(len(lines) for row in captions for lines in row) + 1  # the caption, then the verdict
    text_h = PAD_PX + text_lines * line_h + PAD_PX
    labels = [[_printable(line) for line in label.split("\n")] for label, _ in rows]
    label_w = 2 * PAD_PX + max(int(math.ceil(measure(word))) for words in labels for word in words or [""])
    columns = len(rows[0][1])
    row_h = tile_h + text_h
    size = (GAP_PX + label_w + columns * (GAP_PX + tile_w) + GAP_PX, GAP_PX + len(rows) * (row_h + GAP_PX))
    canvas = Image.new("RGB", size, BACKGROUND)
    pen = ImageDraw.Draw(canvas)
    for r, ((_, tiles), words, row_captions) in enumerate(zip(rows, labels, captions)):
        top = GAP_PX + r * (row_h + GAP_PX)
        # The row's label (its lines), centred on the tiles' height.
        first = top + (tile_h - len(words) * line_h) // 2
        for k, word in enumerate(words):
            pen.text((GAP_PX + PAD_PX, first + k * line_h), word, font=font, fill=INK)
        for c, (tile, lines) in enumerate(zip(tiles, row_captions)):
            left = GAP_PX + label_w + GAP_PX + c * (tile_w + GAP_PX)
            big = np.repeat(np.repeat(tile.image, scale, axis=0), scale, axis=1)
            canvas.paste(Image.fromarray(big, "RGB"), (left, top))
            y = top + tile_h + PAD_PX
            for line in lines:
                pen.text((left + PAD_PX, y), line, font=font, fill=INK)
                y += line_h
            colour = INK if tile.passed is None else PASS_INK if tile.passed else FAIL_INK
            pen.text((left + PAD_PX, top + tile_h + PAD_PX + (text_lines - 1) * line_h), _printable(tile.verdict), font=font, fill=colour)
    return canvas


def save_sheet(path: Path, rows: Sequence[tuple[str, Sequence[Tile]]]) -> Path:
    """`sheet(rows)` as a PNG at `path` (the folder must exist)."""
    sheet(rows).save(path, format="PNG")
    return path


GIF_FRAME_MS = 250  # how long each frame of a clip shows in the animated sheet (slowed down to be read)
STRIP_GAP_PX = 1  # between a strip's frames, in source pixels


def clip_strips(rows: Sequence[tuple[str, Sequence[Tile]]]) -> list[tuple[str, list[Tile]]]:
    """Clips [F, H, W, 3] as frame strips: one sheet row per (item, model), the models of an item
    next to each other, each tile its frames side by side left to right (time runs rightwards)."""
    out = []
    for column in range(len(rows[0][1])):
        for label, tiles in rows:
            tile = tiles[column]
            frames, height, width, _ = tile.image.shape
            strip = np.full((height, frames * width + (frames - 1) * STRIP_GAP_PX, 3), BACKGROUND, dtype=np.uint8)
            for t in range(frames):
                left = t * (width + STRIP_GAP_PX)
                strip[:, left : left + width] = tile.image[t]
            out.append((label, [Tile(strip, tile.caption, tile.verdict, tile.passed)]))
    return out


def save_clip_gif(path: Path, rows: Sequence[tuple[str, Sequence[Tile]]]) -> Path:
    """An animated GIF whose frame t is the sheet of every clip's frame t (looping)."""
    frames = rows[0][1][0].image.shape[0]
    sheets = [sheet([(label, [Tile(t.image[k], t.caption, t.verdict, t.passed) for t in tiles]) for label, tiles in rows])
              for k in range(frames)]  # fmt: skip
    sheets[0].save(path, format="GIF", save_all=True, append_images=sheets[1:], duration=GIF_FRAME_MS, loop=0)
    return path


def save_clips(path: Path, rows: Sequence[tuple[str, Sequence[Tile]]]) -> tuple[Path, Path]:
    """Clip tiles [F, H, W, 3] as (the frame-strip PNG at `path`, the animated GIF beside it with
    the suffix .gif): the strips show every frame at once for a page, the GIF plays the clips side
    by side. A label's line breaks become spaces in the strips, whose label column is one line per row."""
    gif = save_clip_gif(path.with_suffix(".gif"), rows)
    return save_sheet(path, [(label.replace("\n", " "), tiles) for label, tiles in clip_strips(rows)]), gif


def save_sample_grid(path: Path, everyone, texts: Sequence[str], rewards) -> Path:
    """A step's samples, uint8 `everyone` [G, rows, H, W, 3] (clips: [G, rows, F, H, W, 3]) with the
    [rows, G] weighted rewards, as a labelled sheet: a row per prompt, its G
    samples side by side, each with its prompt and its reward under it. Images: one PNG at `path`;
    clips: the frame strips at `path` and the animated GIF beside it (`save_clips`)."""
    group, rows = everyone.shape[:2]
    sheet = [(f"prompt {r + 1}", [Tile(everyone[g, r].numpy(), texts[r], f"reward {float(rewards[r, g]):.3f}") for g in range(group)])
             for r in range(rows)]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    if everyone.dim() == 5:
        return save_sheet(path, sheet)
    return save_clips(path, sheet)[0]
