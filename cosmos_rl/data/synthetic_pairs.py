"""Generated preference pairs for smoke runs and tests: no files, deterministic from a seed.

The preference is meant to be learnable by a tiny flow model in ~100 CPU steps:

- the prompt is ``"a <colour> <shape>"`` from :mod:`cosmos_rl.data.vocab`;
- the **winner** is a clean, smooth image: a soft-edged shape filled with the prompt's
  colour on a grey vertical gradient;
- the **loser** has the same layout (shape, position, size, background) but the shape
  is filled with a *different* colour from the vocabulary, and the whole image carries
  Gaussian pixel noise (std 0.2, clamped to [0, 1]).

So two cues separate the sides: "noise-free beats noisy" needs no text understanding
and is picked up first; "the shape has the colour the prompt names" needs the text
conditioning. Pair ``i`` depends only on ``(seed, i)``, so reads are random-access and
reproducible; ids embed the seed so that two seeds never share an id.

Since a pair is a pure function of ``(seed, index)``, generated pairs are remembered (up to
:data:`MEMO_BYTES` of pixels, least recently read first out) and a repeat read (every epoch after
the first) returns fresh copies of the remembered tensors instead of painting them again: the same
values, and a caller that writes into a pair's tensors cannot change what a later read returns.

Clips (``media.frames`` > 1, a video run): both sides are [3, F, H, W]; frame k is the image pair's
layout with the shape moved right by k x :data:`CLIP_STEP_FRACTION` of the width (wrapping round;
the background gradient is vertical, so only the shape moves), and the loser's noise is drawn for
every frame. An image run's pairs (``media.frames`` = 1) are the same values as before clips existed.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.pair_record import PreferencePair
from cosmos_rl.data.vocab import COLOUR_RGB, SHAPES

LOSER_NOISE_STD = 0.2
# A clip's shape moves this fraction of the width per frame (2 px at 32 px): a motion the VAE keeps.
CLIP_STEP_FRACTION = 1 / 16
_COLOURS = tuple(COLOUR_RGB)
# Most bytes of generated pixels one source remembers (64 MiB: ~2,700 image pairs at 32 px).
MEMO_BYTES = 64 << 20


def _pick(generator: torch.Generator, count: int) -> int:
    return int(torch.randint(count, (1,), generator=generator))


def _shape_mask(shape: str, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """Soft mask in [0, 1], ~1 pixel wide edges so the image stays smooth."""
    ys = torch.arange(height, dtype=torch.float32).view(-1, 1) + 0.5
    xs = torch.arange(width, dtype=torch.float32).view(1, -1) + 0.5
    jitter = torch.rand(3, generator=generator)
    side = min(height, width)
    radius = side * (0.2 + 0.15 * float(jitter[0]))
    cy = height * (0.35 + 0.3 * float(jitter[1]))
    cx = width * (0.35 + 0.3 * float(jitter[2]))
    if shape == "square":
        distance = torch.maximum((ys - cy).abs(), (xs - cx).abs()) - radius
    elif shape == "circle":
        distance = ((ys - cy) ** 2 + (xs - cx) ** 2).sqrt() - radius
    elif shape == "stripe":
        distance = (ys - cy).abs().expand(height, width) - radius / 2
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return torch.sigmoid(-distance * 2.0)


def _paint(mask: torch.Tensor, background: torch.Tensor, colour: str) -> torch.Tensor:
    fill = torch.tensor(COLOUR_RGB[colour]).view(3, 1, 1)
    return background * (1 - mask) + fill * mask


class SyntheticPairs:
    """``n`` generated pairs of ``media`` (its frame size; clips of its frames when a video); see the
    module docstring for the rule."""

    def __init__(self, n: int, media: MediaSpec, seed: int):
        if n <= 0:
            raise ValueError(f"SyntheticPairs needs n > 0, got {n}")
        if seed < 0:
            raise ValueError(f"SyntheticPairs needs seed >= 0, got {seed}")
        self.n = n
        self.media = media
        self.seed = seed
        self._memo: OrderedDict[int, PreferencePair] = OrderedDict()
        self._memo_bytes = 0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_memo": OrderedDict(), "_memo_bytes": 0}  # pickles (Ray) carry no pixels

    def __len__(self) -> int:
        return self.n

    def _id(self, index: int) -> str:
        return f"synthetic-s{self.seed}-{index:06d}"

    def __getitem__(self, index: int) -> PreferencePair:
        if not 0 <= index < self.n:
            raise IndexError(f"pair index {index} out of range [0, {self.n})")
        pair = self._memo.get(index)
        if pair is None:
            pair = self._remember(index, self._generate(index))
        else:
            self._memo.move_to_end(index)
        return PreferencePair(pair.id, pair.prompt, pair.winner.clone(), pair.loser.clone())

    def _remember(self, index: int, pair: PreferencePair) -> PreferencePair:
        size = pair.winner.nbytes + pair.loser.nbytes
        while self._memo and self._memo_bytes + size > MEMO_BYTES:
            _, old = self._memo.popitem(last=False)
            self._memo_bytes -= old.winner.nbytes + old.loser.nbytes
        if size <= MEMO_BYTES:
            self._memo[index] = pair
            self._memo_bytes += size
        return pair

    def _generate(self, index: int) -> PreferencePair:
        # A large odd multiplier keeps (seed, index) streams distinct for any realistic n. torch takes
        # 64 bits; folding leaves every value that already fit (so every existing stream) unchanged.
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + index) % 2**64)
        colour = _COLOURS[_pick(generator, len(_COLOURS))]
        shape = SHAPES[_pick(generator, len(SHAPES))]
        other = [c for c in _COLOURS if c != colour][_pick(generator, len(_COLOURS) - 1)]
        height, width = self.media.size
        mask = _shape_mask(shape, height, width, generator)
        gradient = torch.linspace(0.35, 0.65, height).view(1, height, 1).expand(3, height, width)
        winner = _paint(mask, gradient, colour)
        prompt = f"a {colour} {shape}"
        if self.media.is_video:
            return PreferencePair(self._id(index), prompt, *self._clips(mask, gradient, colour, other, generator))
        noise = torch.randn(3, height, width, generator=generator) * LOSER_NOISE_STD
        loser = (_paint(mask, gradient, other) + noise).clamp(0.0, 1.0)
        return PreferencePair(self._id(index), prompt, winner.contiguous(), loser)

    def _clips(self, mask, gradient, colour: str, other: str, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(winner, loser) clips [3, F, H, W]: the shape moving right, the loser noisy in every frame."""
        height, width = self.media.size
        frames = self.media.frames
        step = max(1, round(width * CLIP_STEP_FRACTION))
        masks = torch.stack([torch.roll(mask, k * step, dims=1) for k in range(frames)])  # [F, H, W]
        winner = torch.stack([_paint(m, gradient, colour) for m in masks], dim=1)
        noise = torch.randn(3, frames, height, width, generator=generator) * LOSER_NOISE_STD
        loser = (torch.stack([_paint(m, gradient, other) for m in masks], dim=1) + noise).clamp(0.0, 1.0)
        return winner.contiguous(), loser.contiguous()

    def membership_ids(self) -> list[str]:
        return [self._id(index) for index in range(self.n)]
