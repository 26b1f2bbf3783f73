"""Weight-free reward functions served by the built-in reward service (a suite's rewards register
through the suite: `rewards.registry`, `cosmos_rl.suites`).

Every function has the signature fn(images, prompts) -> list[float], where `images` is a uint8
numpy array [N, H, W, 3] (RGB) and `prompts` holds the N prompts the images were made from.
Higher is better for every reward.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from cosmos_rl.data.pixels import to_uint8  # noqa: F401  (the conversion reward authors are pointed to)
from cosmos_rl.data.vocab import COLOUR_RGB255

RewardFn = Callable[[np.ndarray, Sequence[str]], list[float]]

JPEG_QUALITY = 95


def check_images(images: np.ndarray, prompts: Sequence[str]) -> None:
    """Raise ValueError unless `images` is uint8 [N, H, W, 3] with one prompt per image."""
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
        got = type(images).__name__ if not isinstance(images, np.ndarray) else images.dtype
        raise ValueError(f"images must be a uint8 numpy array, got {got}; use to_uint8() first")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be shaped [N, H, W, 3], got {images.shape}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"got {images.shape[0]} images but {len(prompts)} prompts")


def jpeg_size_kb(image: np.ndarray) -> float:
    """Size in kB (1000 bytes) of one uint8 [H, W, 3] image saved as JPEG at quality 95."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.tell() / 1000.0


def jpeg_compressibility(images: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """Minus the JPEG size in kB (DDPO's definition): smaller files, higher reward.

    No /500 rescaling (the later repos' choice): NFT divides advantages by the reward std, so
    a constant scale changes nothing there, and raw kB is easier to read in the metrics.
    """
    check_images(images, prompts)
    return [-jpeg_size_kb(image) for image in images]


def jpeg_incompressibility(images: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """Plus the JPEG size in kB: more detail/noise, higher reward."""
    check_images(images, prompts)
    return [jpeg_size_kb(image) for image in images]


def brightness(images: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """Mean pixel value scaled to [0, 1]; a smooth target any model moves within a few steps."""
    check_images(images, prompts)
    return [float(image.mean()) / 255.0 for image in images]


# Colours a prompt may name for `prompt_colour`; RGB in 0..255 (one table for the whole project).
COLOURS = COLOUR_RGB255


def colour_named_in(prompt: str) -> tuple[int, int, int]:
    """RGB of the first colour word in `prompt`; ValueError if it names none."""
    for word in re.findall(r"[a-z]+", prompt.lower()):
        if word in COLOURS:
            return COLOURS[word]
    raise ValueError(
        f"prompt {prompt!r} names no colour; prompt_colour needs one of {sorted(COLOURS)}"
    )


def prompt_colour(images: np.ndarray, prompts: Sequence[str]) -> list[float]:
    """1 - mean |pixel - colour named in the prompt| / 255, in [0, 1]; 1 = a flat image of it.

    Prompt-conditional, so it checks that the trainer pairs each image with its own prompt,
    yet weight-free and smooth enough for a tiny random model to improve visibly.
    """
    check_images(images, prompts)
    targets = [colour_named_in(p) for p in prompts]  # fail before any work on a bad prompt
    scores = []
    for image, target in zip(images, targets):
        distance = np.abs(image.astype(np.float64) - np.asarray(target, dtype=np.float64))
        scores.append(1.0 - float(distance.mean()) / 255.0)
    return scores


REWARDS: dict[str, RewardFn] = {
    "jpeg_compressibility": jpeg_compressibility,
    "jpeg_incompressibility": jpeg_incompressibility,
    "brightness": brightness,
    "prompt_colour": prompt_colour,
}
